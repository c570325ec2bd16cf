"""Lines of a report laid out for a person: phrases (``flow``) broken only between them at the width, a sentence
cut into such phrases where it allows a break (``clauses``). ``shardprep validate`` prints its report with them."""

from __future__ import annotations


def flow(items, width: int, indent: str = "  "):
    """One rich ``Text`` of ``items`` (``(separator before it, phrase)``; phrases are ``Text`` or plain strings,
    never read as markup) laid out in lines of at most ``width`` cells, broken only between phrases: a line ends with
    the separator's punctuation and the next starts indented. A phrase wider than a line alone is left to wrap."""
    from rich.text import Text

    lines, line = [], Text()
    phrases = list(_words_of_long_phrases(items, width - len(indent)))
    for index, (separator, phrase) in enumerate(phrases):
        if not line.plain:
            line.append_text(phrase)
            continue
        # Room for the punctuation that a break after this phrase would leave at the line's end (the next ';').
        trailing = len(phrases[index + 1][0].rstrip()) if index + 1 < len(phrases) else 0
        if line.cell_len + len(separator) + phrase.cell_len + trailing <= width:
            line.append(separator)
        else:
            line.append(separator.rstrip())
            lines.append(line)
            line = Text(indent)
        line.append_text(phrase)
    lines.append(line)
    return Text("\n").join(lines)


def _words_of_long_phrases(items, room: int):
    """``items`` as ``Text`` phrases, each phrase longer than ``room`` cut into its words (then it breaks between
    words, indented like any other break, rather than being wrapped by the terminal)."""
    from rich.text import Text

    for separator, phrase in items:
        phrase = phrase if isinstance(phrase, Text) else Text(phrase)
        if phrase.cell_len <= room or " " not in phrase.plain:
            yield separator, phrase
            continue
        start = 0
        for index, word in enumerate(phrase.plain.split(" ")):
            yield (separator if index == 0 else " "), phrase[start:start + len(word)]
            start += len(word) + 1


def clauses(text: str) -> list[tuple[str, str]]:
    """``text`` cut where a sentence of ours allows a break (after ': ', '; ', ', ' before a word, before a
    parenthesis of words), as ``flow`` items; lists of numbers stay whole."""
    import re

    pieces = re.split(r"(: |; |, (?=[A-Za-z])| (?=\([A-Za-z]))", text)
    items, separator = [], ""
    for index, piece in enumerate(pieces):
        if index % 2:
            separator = piece
        elif piece:
            items.append((separator, piece))
    return items
