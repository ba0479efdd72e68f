"""Image classifiers as torchvision and timm define them, written out here in torch (no
torchvision beside the torch 2.13 CPU build: its wheel needs another torch) at reduced
widths or depths where the full size adds only time: the layer kinds, strides, paddings
and activations are the originals'."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from corpus_models.spec import Feed, Spec
from corpus_models.torch_export import export, seeded


def conv_bn(cin, cout, k=3, s=1, groups=1, act=nn.ReLU, pad=None):
    layers = [nn.Conv2d(cin, cout, k, s, k // 2 if pad is None else pad, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


# -- ResNet ---------------------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = conv_bn(cin, cout, 3, stride)
        self.b = conv_bn(cout, cout, 3, 1, act=None)
        self.skip = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.b(self.a(x)) + self.skip(x))


class ResNet(nn.Module):
    """ResNet-18's layout (2-2-2-2 basic blocks), widths 32-64-128-256 (half of torchvision's)."""

    def __init__(self, widths=(32, 64, 128, 256), classes=1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, widths[0], 7, 2), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# -- MobileNetV2 / V3 -----------------------------------------------------------------------------------------


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand, k=3, act=nn.ReLU6, se=False, se_gate=nn.Hardsigmoid):
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn(cin, hidden, 1, act=act)] if expand != 1 else []
        layers.append(conv_bn(hidden, hidden, k, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcite(hidden, max(8, hidden // 4), gate=se_gate))
        layers.append(conv_bn(hidden, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class SqueezeExcite(nn.Module):
    def __init__(self, channels, squeezed, act=nn.ReLU, gate=nn.Hardsigmoid):
        super().__init__()
        self.reduce, self.act = nn.Conv2d(channels, squeezed, 1), act()
        self.expand, self.gate = nn.Conv2d(squeezed, channels, 1), gate()

    def forward(self, x):
        return x * self.gate(self.expand(self.act(self.reduce(F.adaptive_avg_pool2d(x, 1)))))


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 at width 1.0, full depth."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]

    def __init__(self, classes=1000):
        super().__init__()
        layers, cin = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class MobileNetV3Small(nn.Module):
    """torchvision's MobileNetV3-Small: hard-swish, squeeze-and-excite with a hard sigmoid, 5x5 depthwise."""

    # kernel, expanded, out, se, activation, stride
    SETTINGS = [(3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
                (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
                (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
                (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1)]

    def __init__(self, classes=1000):
        super().__init__()
        layers, cin = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)], 16
        for k, exp, out, se, a, s in self.SETTINGS:
            act = nn.Hardswish if a == "HS" else nn.ReLU
            block = nn.Sequential(
                *([conv_bn(cin, exp, 1, act=act)] if exp != cin else []),
                conv_bn(exp, exp, k, s, groups=exp, act=act),
                *([SqueezeExcite(exp, _divisible(exp // 4))] if se else []),
                conv_bn(exp, out, 1, act=None))
            layers.append(Residual(block) if s == 1 and cin == out else block)
            cin = out
        layers.append(conv_bn(cin, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(1024, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class Residual(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


def _divisible(v, d=8):
    return max(d, int(v + d / 2) // d * d)


# -- EfficientNet-B0, TensorFlow style ------------------------------------------------------------------------


class SamePadConv(nn.Conv2d):
    """TensorFlow's "SAME" padding as ported EfficientNets spell it: an explicit F.pad
    (an ONNX Pad before the Conv), asymmetric on strided layers."""

    def forward(self, x):
        k, s = self.kernel_size[0], self.stride[0]
        pad = max(k - s, 0)
        x = F.pad(x, [pad // 2, pad - pad // 2, pad // 2, pad - pad // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, 1, self.groups)


class MBConv(nn.Module):
    def __init__(self, cin, cout, k, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU()) \
            if expand != 1 else nn.Identity()
        self.depthwise = nn.Sequential(SamePadConv(hidden, hidden, k, stride, groups=hidden, bias=False),
                                       nn.BatchNorm2d(hidden), nn.SiLU())
        self.se = SqueezeExcite(hidden, max(1, cin // 4), act=nn.SiLU, gate=nn.Sigmoid)
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class EfficientNetB0(nn.Module):
    """EfficientNet-B0's stages at full width and depth, SAME padding spelled as Pad."""

    STAGES = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
              (6, 192, 4, 2, 5), (6, 320, 1, 1, 3)]

    def __init__(self, classes=1000):
        super().__init__()
        layers = [SamePadConv(3, 32, 3, 2, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
        cin = 32
        for t, c, n, s, k in self.STAGES:
            for i in range(n):
                layers.append(MBConv(cin, c, k, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# -- ConvNeXt -------------------------------------------------------------------------------------------------


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over channels of an NCHW image, as ConvNeXt's downsampling layers do it."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt-T's design at dims 48-96-192-384 (half) and depths 1-1-3-1 (of 3-3-9-3)."""

    def __init__(self, dims=(48, 96, 192, 384), depths=(1, 1, 3, 1), classes=1000):
        super().__init__()
        layers = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
        for i, (d, n) in enumerate(zip(dims, depths)):
            if i:
                layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], d, 2, 2)]
            layers += [ConvNeXtBlock(d) for _ in range(n)]
        self.features = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(dims[-1], eps=1e-6), nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean((2, 3))))


# -- RegNetY --------------------------------------------------------------------------------------------------


class YBlock(nn.Module):
    def __init__(self, cin, cout, stride, group_width):
        super().__init__()
        self.a = conv_bn(cin, cout, 1)
        self.b = conv_bn(cout, cout, 3, stride, groups=cout // group_width)
        self.se = SqueezeExcite(cout, max(1, cin // 4), gate=nn.Sigmoid)
        self.c = conv_bn(cout, cout, 1, act=None)
        self.skip = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.c(self.se(self.b(self.a(x)))) + self.skip(x))


class RegNetY(nn.Module):
    """RegNetY-400MF's widths (48-104-208-440), group width 8, depths 1-2-4-2 (of 1-3-6-6)."""

    def __init__(self, widths=(48, 104, 208, 440), depths=(1, 2, 4, 2), group_width=8, classes=1000):
        super().__init__()
        layers, cin = [conv_bn(3, 32, 3, 2)], 32
        for w, n in zip(widths, depths):
            for i in range(n):
                layers.append(YBlock(cin, w, 2 if i == 0 else 1, group_width))
                cin = w
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def classifier(make, size: int, dynamo: bool = False, hw_dynamic: bool = True):
    def build(path: str) -> list[Feed]:
        seeded()
        dynamic = {"image": {0: "batch", 2: "height", 3: "width"} if hw_dynamic else {0: "batch"},
                   "logits": {0: "batch"}}
        return export(make(), [Feed("image", [1, 3, size, size])], path, ["logits"], dynamic, dynamo=dynamo)
    return build


MODELS = [
    Spec("resnet18_half", "ResNet-18 layout at half width (32-256 channels), 1x3x160x160; batch, height, width "
         "dynamic", "torchscript", classifier(ResNet, 160)),
    Spec("resnet18_half_dynamo", "the same ResNet through the dynamo exporter", "dynamo",
         classifier(ResNet, 160, dynamo=True)),
    Spec("mobilenetv2", "torchvision's MobileNetV2 (width 1.0, full depth), 1x3x160x160; batch, height, width "
         "dynamic", "torchscript", classifier(MobileNetV2, 160)),
    Spec("mobilenetv2_dynamo", "the same MobileNetV2 through the dynamo exporter", "dynamo",
         classifier(MobileNetV2, 160, dynamo=True)),
    Spec("mobilenetv3_small", "MobileNetV3-Small (hard-swish, SE with hard sigmoid, 5x5 depthwise), full size, "
         "1x3x160x160; batch, height, width dynamic", "torchscript", classifier(MobileNetV3Small, 160)),
    Spec("efficientnet_b0", "EfficientNet-B0, full size, TF-style SAME padding as explicit Pad, strided "
         "depthwise, SE, SiLU; 1x3x160x160, batch dynamic", "torchscript",
         classifier(EfficientNetB0, 160, hw_dynamic=False)),
    Spec("convnext_reduced", "ConvNeXt-T design at half width, depths 1-1-3-1: 7x7 depthwise, channels-last "
         "LayerNorm, GELU, layer scale; 1x3x128x128, batch, height, width dynamic", "torchscript",
         classifier(ConvNeXt, 128)),
    Spec("regnety_reduced", "RegNetY-400MF widths, group width 8, SE, depths 1-2-4-2; 1x3x160x160, batch, "
         "height, width dynamic", "torchscript", classifier(RegNetY, 160)),
]
