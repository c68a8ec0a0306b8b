"""Names for torch's and transformers' objects in the engines' signatures.

torch, transformers and numpy are imported lazily, inside the functions that use them, so
the server (and the synthetic and vLLM engines) start without importing them; their objects
are therefore untyped here. Each kind gets one alias, so an annotation still says what a
value is, and the untyped name is written once for each rather than in every signature.
"""

from __future__ import annotations

from typing import Any, TypeAlias

Tensor: TypeAlias = Any  # a torch.Tensor (torch is imported lazily)
Model: TypeAlias = Any  # a loaded transformers model / torch module (imported lazily)
KvCache: TypeAlias = Any  # a transformers Cache (DynamicCache or our static views; imported lazily)
Dtype: TypeAlias = Any  # a torch.dtype (torch is imported lazily)
Generator: TypeAlias = Any  # a torch.Generator (torch is imported lazily)
Array: TypeAlias = Any  # a numpy array (numpy is imported lazily)
CudaGraph: TypeAlias = Any  # a torch.cuda.CUDAGraph (torch is imported lazily)
ModelConfig: TypeAlias = Any  # a transformers PretrainedConfig (imported lazily)
