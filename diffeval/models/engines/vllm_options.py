"""The vLLM engine's own options (placement and memory), apart from its module so that the CLI builds `--help`
without importing vLLM. None is part of a run's identity: a folder resumes with other values."""

from __future__ import annotations

from dataclasses import dataclass

from diffeval.config import EngineOptions, option
from diffeval.errors import InputError


@dataclass(frozen=True)
class VLLMOptions(EngineOptions):
    tensor_parallel_size: int = option(1, help="vllm: GPUs per model (tensor parallel) [default: 1]", identity=False)
    gpu_memory_utilization: float = option(
        0.9, help="vllm: fraction of GPU memory the engine may take [default: 0.9]", identity=False
    )
    enforce_eager: bool = option(
        False, help="vllm: no CUDA graphs or compilation (faster start, slower decode); always on CPU", identity=False
    )
    max_model_len: int | None = option(
        None, help="vllm: longest sequence [default: the longest --ctx]", type=int, identity=False
    )
    kv_cache_gib: float | None = option(
        None,
        help="vllm: KV cache size in GiB [default: GPU: from the memory fraction; CPU: what the run needs, <= 2]",
        type=float,
        identity=False,
    )

    def validate(self) -> None:
        if self.tensor_parallel_size < 1 or not 0 < self.gpu_memory_utilization <= 1:
            raise InputError("--tensor-parallel-size must be at least 1 and --gpu-memory-utilization in (0, 1]")
        if (self.kv_cache_gib is not None and self.kv_cache_gib <= 0) or (
            self.max_model_len is not None and self.max_model_len < 1
        ):
            raise InputError("--kv-cache-gib and --max-model-len must be positive")

    def worker_gpus(self) -> float:
        """A model spans --tensor-parallel-size GPUs, all in one worker."""
        return self.tensor_parallel_size
