"""The typed option groups every command is built from (`adaflash.settings` explains the machinery).

One group per concern: the model (`ModelConfig`), sampling (`SamplingConfig`), the inputs
(`InputConfig`), the server and its clients (`ServeConfig`), benchmarks (`BenchConfig`), drafter shape
(`DrafterConfig`), training (`TrainOptions`), the pipeline (`PipelineOptions`), data preparation
(`PrepConfig`), recipes and the run log (`RecipeConfig`, `RunsConfig`), the job around the work
(`JobConfig`) and profiling (`ProfileConfig`); the engine's is `adaflash.engine.config.EngineConfig`,
`serve --adapt`'s `adaflash.serve.adapt_config.AdaptConfig`. No click and no torch here.
"""

from adaflash.options.bench import BenchConfig
from adaflash.options.drafter import DrafterConfig
from adaflash.options.inputs import InputConfig
from adaflash.options.job import JobConfig, ProfileConfig
from adaflash.options.model import ModelConfig
from adaflash.options.pipeline import PipelineOptions
from adaflash.options.prep import PrepConfig
from adaflash.options.recipe import RecipeConfig, RunsConfig
from adaflash.options.sampling import SamplingConfig
from adaflash.options.serve import ServeConfig
from adaflash.options.train import TrainOptions

__all__ = ["BenchConfig", "DrafterConfig", "InputConfig", "JobConfig", "ModelConfig", "PipelineOptions",
           "PrepConfig", "ProfileConfig", "RecipeConfig", "RunsConfig", "SamplingConfig", "ServeConfig",
           "TrainOptions"]
