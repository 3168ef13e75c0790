"""Models: 2D3D-ResNet encoder, ConvGRU, MemDPC (uni/bi) and the DPC baseline, heads, checkpoint import."""

from memdpc.model.factory import MODEL_NAMES, create_model
from memdpc.model.heads import Classifier, LinearHead, MLPHead, OopsHead
from memdpc.model.memdpc import MemDPC

__all__ = ["MODEL_NAMES", "Classifier", "LinearHead", "MLPHead", "MemDPC", "OopsHead", "create_model"]
