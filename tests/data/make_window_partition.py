"""Writes tests/data/window_partition.onnx with PyTorch's TorchScript exporter.

Swin's window partitioning and MobileViT's patch folding compute their view shapes from
the input's own sizes (`h // window`), and TorchScript's exporter writes that arithmetic
as Shape -> Gather (a 0-d int64) -> Div by a 0-d int64 constant -> Cast -> Concat ->
Reshape: the graph nncc's shape inference must follow. Run once, with torch installed:

    python tests/data/make_window_partition.py
"""

import pathlib

import torch

WINDOW = 4


class WindowPartition(torch.nn.Module):
    """(B, H, W, C) -> (B * H/w * W/w, w, w, C) windows (Swin), then each window's
    pixels folded back into patches of 2 x 2 (MobileViT's unfolding, reversed)."""

    def forward(self, x):
        b, h, w, c = x.shape
        windows = x.view(b, h // WINDOW, WINDOW, w // WINDOW, WINDOW, c)
        windows = windows.permute(0, 1, 3, 2, 4, 5).reshape(-1, WINDOW, WINDOW, c)
        n = windows.shape[0]
        patches = windows.reshape(n, WINDOW // 2, 2, WINDOW // 2, 2, c).transpose(2, 3)
        return windows * 2.0, patches.reshape(n * (WINDOW // 2) ** 2, 4, c)


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("window_partition.onnx")
    torch.onnx.export(WindowPartition(), (torch.randn(2, 8, 12, 3),), str(out), dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["windows", "patches"],
                      dynamic_axes={"x": {0: "batch", 1: "height", 2: "width"}})
    print(out, out.stat().st_size, "bytes")
