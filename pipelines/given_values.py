"""Values the launcher already holds, as the graph's first elements, in as few ParDos as Beam allows.

Every ParDo costs a local run's start-up: Beam inspects its DoFn several times while building and translating the
graph (the signature of each of its methods) and again for each stage's bundle processor. ``beam.Create`` takes two
ParDos (it encodes the values with a coder it infers, then decodes them) and ``beam.Reshuffle`` four; these take
one, and three with the spreading shuffle. The values travel pickled inside the one DoFn, as ``beam.Create``'s do
inside its own.
"""

from __future__ import annotations

import apache_beam as beam


def _given(_, values):
    return values


def _keyed_by_index(_, values):
    return enumerate(values)


def _grouped_values(keyed):
    return keyed[1]


class GivenValues(beam.PTransform):
    """The pipeline's start -> each of ``values``, one element each (what ``beam.Create(values)`` gives, in one
    ParDo instead of two), all on the worker that runs the start."""

    def __init__(self, values):
        super().__init__()
        self.values = list(values)

    def expand(self, pbegin):
        return (pbegin
                | "Start" >> beam.Impulse()
                | "Values" >> beam.FlatMap(_given, self.values).with_output_types(beam.typehints.Any))


class SpreadValues(GivenValues):
    """The pipeline's start -> each of ``values``, spread over the workers: each keyed by its index and grouped,
    the shuffle ``beam.Reshuffle`` makes, so that the next ParDo runs on several workers at once (``beam.Create``
    then ``beam.Reshuffle``: six ParDos; here two)."""

    def expand(self, pbegin):
        return (pbegin
                | "Start" >> beam.Impulse()
                | "KeyedByIndex" >> beam.FlatMap(_keyed_by_index, self.values).with_output_types(
                    beam.typehints.KV[int, beam.typehints.Any])
                | "Spread" >> beam.GroupByKey()
                | "Values" >> beam.FlatMap(_grouped_values).with_output_types(beam.typehints.Any))
