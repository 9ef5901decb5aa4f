"""Plain-data (msgspec) types shared by the engine and the executors.

They sit below both packages so that ``kernelcore.executor`` never imports ``kernelcore.engine`` and the
engine reaches an executor only through the executor registry. One concept per module:
``sampling_params`` (what a request asks of the sampler), ``scheduler_output`` (scheduler -> workers) and
``runner_output`` (worker -> engine core).
"""

from kernelcore.core_types.runner_output import ModelRunnerOutput, TokenLogprobs
from kernelcore.core_types.sampling_params import MAX_SEED, SamplingParams
from kernelcore.core_types.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput

__all__ = ["CachedRequestData", "MAX_SEED", "ModelRunnerOutput", "NewRequestData", "SamplingParams",
           "SchedulerOutput", "TokenLogprobs"]
