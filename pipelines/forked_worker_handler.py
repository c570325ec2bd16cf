"""Beam's side of the worker zygote (``worker_zygote``): the environment and worker handler with which the local
runner's SDK workers are forked by the zygote instead of started as new interpreters.

The environment is Beam's subprocess environment under a URN of our own, so that only runs made by
``runner.make_pipeline`` use this handler; while a zygote is active it starts a worker as Beam's
``SubprocessSdkWorker`` does (its logging server, its environment variables, its exit-status check), asking the
zygote instead of ``subprocess.Popen``, and falls back to Beam's own way if the zygote is gone. Without a zygote
Beam's own ``SubprocessSdkWorker`` starts it. Either way a worker that fails fails the run (``_run_worker``).
"""

from __future__ import annotations

import functools
import os
import signal
import threading

from shardprep.pipelines import stopping, worker_zygote

FORKED_PYTHON_URN = "shardprep:env:forked_python_worker:v1"


def local_workers_environment(environment):
    """``environment`` itself, or, for Beam's subprocess environment, the same environment under our URN: its workers
    forked by the zygote while one is active, and watched (``_run_worker``) however they are started."""
    from apache_beam.transforms import environments

    if type(environment) is not environments.SubprocessSDKEnvironment:
        return environment
    forked = _registered()[0]
    return forked(environment.command_string, environment.capabilities(), environment.artifacts(),
                  environment.resource_hints())


@functools.cache
def _registered():
    """Registers the environment and its worker handler with Beam (once, when first needed: not on import)."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    from apache_beam.transforms import environments

    @environments.Environment.register_urn(FORKED_PYTHON_URN, bytes)
    class ForkedPythonEnvironment(environments.SubprocessSDKEnvironment):
        def to_runner_api_parameter(self, context):
            return FORKED_PYTHON_URN, self.command_string.encode("utf-8")

        @staticmethod
        def from_runner_api_parameter(payload, capabilities, artifacts, resource_hints, context):
            return ForkedPythonEnvironment(payload.decode("utf-8"), capabilities, artifacts, resource_hints)

    @worker_handlers.WorkerHandler.register_environment(FORKED_PYTHON_URN, bytes)
    class ForkedSdkWorkerHandler(worker_handlers.SubprocessSdkWorkerHandler):
        def start_worker(self):
            zygote = worker_zygote.active()
            if zygote is None:  # SHARDPREP_FORKED_WORKERS=0, or no zygote could be made: Beam starts the worker
                self.worker = _sdk_worker_class()(self._worker_command_line, self.control_address,
                                                  self.provision_info, self.worker_id)
            else:
                self.worker = _ForkedSdkWorker(zygote, self._worker_command_line, self.control_address,
                                               self.provision_info, self.worker_id)
            self.worker_thread = threading.Thread(name="run_worker", target=_run_worker,
                                                  args=(self.worker, self.data_conn))
            self.worker_thread.start()

    return ForkedPythonEnvironment, ForkedSdkWorkerHandler


def _run_worker(worker, data_conn) -> None:
    """Runs ``worker`` until its process ends; if it failed, breaks the runner's data stream from it, as Beam does
    when a connected worker's stream breaks (the run then fails with "Channel closed prematurely"). A worker that
    died before it connected has no stream to break: the runner would wait for its data forever. Aborting its
    control connection would not do: that wait asks the control side only whether a response came (an aborted
    request has none); the broken channel also fails every later wait on it."""
    try:
        worker.run()
    except Exception as error:
        data_conn.set_inputs(_broken_stream(RuntimeError(str(error))))
        raise


def _broken_stream(error: Exception):
    raise error
    yield  # a generator: the data channel's reader thread raises it


def _sdk_worker_class():
    from apache_beam.runners.portability import local_job_service

    return local_job_service.SubprocessSdkWorker


class _ForkedSdkWorker:
    """Beam's ``SubprocessSdkWorker.run``, with the worker forked by ``zygote`` (Beam's own start if it is gone)."""

    def __init__(self, zygote, worker_command_line: bytes, control_address, provision_info, worker_id=None):
        self.zygote = zygote
        self.fallback = _sdk_worker_class()(worker_command_line, control_address, provision_info, worker_id)
        self.control_address, self.provision_info, self.worker_id = control_address, provision_info, worker_id

    def run(self):
        import grpc
        from apache_beam.portability.api import beam_fn_api_pb2_grpc, endpoints_pb2
        from apache_beam.runners.portability.local_job_service import BeamFnLoggingServicer
        from apache_beam.utils import thread_pool_executor
        from google.protobuf import json_format, text_format

        options = [("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)]
        logging_server = grpc.server(thread_pool_executor.shared_unbounded_instance(), options=options)
        logging_port = logging_server.add_insecure_port("[::]:0")
        logging_server.start()
        beam_fn_api_pb2_grpc.add_BeamFnLoggingServicer_to_server(BeamFnLoggingServicer(), logging_server)
        environment = dict(
            os.environ,
            CONTROL_API_SERVICE_DESCRIPTOR=text_format.MessageToString(
                endpoints_pb2.ApiServiceDescriptor(url=self.control_address)),
            LOGGING_API_SERVICE_DESCRIPTOR=text_format.MessageToString(
                endpoints_pb2.ApiServiceDescriptor(url=f"localhost:{logging_port}")),
            PIPELINE_OPTIONS=json_format.MessageToJson(self.provision_info.provision_info.pipeline_options))
        if self.worker_id:
            environment["WORKER_ID"] = self.worker_id
        try:
            worker = self.zygote.start_worker(environment)
        except OSError:  # the zygote is gone (killed) or stuck: Beam's own way, unless the run is being stopped
            logging_server.stop(0)
            stopping.check_not_stopped()
            return self.fallback.run()
        try:
            _wait_for(worker)
        finally:
            logging_server.stop(0)


def _wait_for(worker: worker_zygote.ForkedWorker) -> None:
    """Waits for the worker to exit and raises as Beam's ``SubprocessSdkWorker`` does if it failed; kills it if the
    wait is cut short or its zygote went first (its exit status then unknown: reported as killed)."""
    status = None
    try:
        status = worker.wait()
    finally:
        if status is None:
            worker.kill()
    if status is None:
        status = -signal.SIGKILL
    if status:
        raise RuntimeError(f"Worker subprocess exited with return code {status}")
