"""PyTorch's FP8 training reference: the course's model with its layers' linear layers computed by
torch._scaled_mm (cuBLASLt), tensorwise current scaling, as tfhost's precision "fp8" does: weights
and activations e4m3 scaled by their amax onto 448, gradients e5m2 onto 57344, the three products
of a linear layer (y = x W^T, dx = dy W, dW = dy^T x) in FP8, dW in f32; lm_head, attention, norms
and the loss stay in bf16 autocast. torchao's float8 training is the packaged form of this recipe
(it is not installed on the GPU machines); this is the same arithmetic by hand.

    from torch_fp8_linear import use_fp8
    use_fp8(model)   # before torch.compile
"""
import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
MAX = {E4M3: 448.0, E5M2: 57344.0}


def cast(t, dtype):
    """t in dtype by current scaling: (codes, the product's scale amax / max)."""
    amax = t.abs().max().float()
    q = torch.where(amax > 0, MAX[dtype] / amax, torch.ones_like(amax))
    return (t.float() * q).clamp(-MAX[dtype], MAX[dtype]).to(dtype), (1.0 / q).reshape(())


class Fp8Matmul(torch.autograd.Function):
    """y (n, out) = x (n, in) W^T with W (out, in): all three products in FP8."""

    @staticmethod
    def forward(ctx, x, w):
        x8, xs = cast(x, E4M3)
        w8, ws = cast(w, E4M3)
        ctx.save_for_backward(x8, xs, w8, ws)
        return torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):
        x8, xs, w8, ws = ctx.saved_tensors
        dy8, ds = cast(dy, E5M2)
        # dx = dy W: W as the column-major (out, in) operand
        dx = torch._scaled_mm(dy8, w8.t().contiguous().t(), scale_a=ds, scale_b=ws, out_dtype=torch.bfloat16)
        # dW = dy^T x: dy^T row-major, x column-major
        dw = torch._scaled_mm(dy8.t().contiguous(), x8.t().contiguous().t(), scale_a=ds, scale_b=xs,
                              out_dtype=torch.float32)
        return dx, dw


def fp8_forward(self, x):
    shape = x.shape
    y = Fp8Matmul.apply(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight)
    return y.reshape(*shape[:-1], y.shape[-1])


def use_fp8(model):
    """Every linear layer of model's blocks (not lm_head) through Fp8Matmul."""
    for block in model.layers:
        for module in block.modules():
            if type(module).__name__ == "Linear":
                module.forward = fp8_forward.__get__(module)
    return model
