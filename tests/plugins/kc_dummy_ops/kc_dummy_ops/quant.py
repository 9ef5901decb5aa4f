"""A vendor quantization method: weights stored as float16, multiplied in the activation dtype."""

import torch
import torch.nn.functional as F
from torch import nn

from kernelcore.layers.linear import LinearMethodBase


class Fp16WeightMethod(LinearMethodBase):
    def process_weights_after_loading(self, layer):
        if not getattr(layer, "is_tied", False):
            layer.weight = nn.Parameter(layer.weight.data.to(torch.float16), requires_grad=False)

    def apply(self, layer, x, bias):
        return F.linear(x, layer.weight.to(x.dtype), bias)
