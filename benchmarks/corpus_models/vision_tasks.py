"""Detection, segmentation and text recognition, as their reference implementations build
them, at reduced widths: a YOLO-style detector (CSP blocks, SiLU, SPPF, nearest Resize,
a decoupled head), a DETR-style detector (a CNN and an encoder-decoder transformer with
learned queries), a U-Net (ConvTranspose up, bilinear Resize on the skip path) and a CRNN
(convolutions, a bidirectional LSTM over the width, per-column classes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from corpus_models.spec import Feed, Spec
from corpus_models.torch_export import export, seeded
from corpus_models.vision import ResNet, conv_bn


def cbs(cin, cout, k=1, s=1):
    """YOLO's Conv-BN-SiLU."""
    return conv_bn(cin, cout, k, s, act=nn.SiLU)


class C2f(nn.Module):
    def __init__(self, cin, cout, n=1):
        super().__init__()
        hidden = cout // 2
        self.split = cbs(cin, 2 * hidden)
        self.blocks = nn.ModuleList(nn.Sequential(cbs(hidden, hidden, 3), cbs(hidden, hidden, 3)) for _ in range(n))
        self.join = cbs((2 + n) * hidden, cout)

    def forward(self, x):
        parts = list(self.split(x).chunk(2, 1))
        for block in self.blocks:
            parts.append(parts[-1] + block(parts[-1]))
        return self.join(torch.cat(parts, 1))


class SPPF(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a, self.b = cbs(c, c // 2), cbs(c * 2, c)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.a(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.b(torch.cat([x, y1, y2, self.pool(y2)], 1))


class YoloStyle(nn.Module):
    """A YOLOv8-n-like network: backbone, PAN neck, decoupled box/class heads at strides
    8, 16, 32, outputs concatenated over the three scales as [batch, 4 + classes, anchors]."""

    def __init__(self, w=(16, 32, 64, 128, 256), classes=80):
        super().__init__()
        self.stem = nn.Sequential(cbs(3, w[0], 3, 2), cbs(w[0], w[1], 3, 2), C2f(w[1], w[1]))
        self.p3 = nn.Sequential(cbs(w[1], w[2], 3, 2), C2f(w[2], w[2], 2))
        self.p4 = nn.Sequential(cbs(w[2], w[3], 3, 2), C2f(w[3], w[3], 2))
        self.p5 = nn.Sequential(cbs(w[3], w[4], 3, 2), C2f(w[4], w[4]), SPPF(w[4]))
        self.up4, self.up3 = C2f(w[4] + w[3], w[3]), C2f(w[3] + w[2], w[2])
        self.down4, self.n4 = cbs(w[2], w[2], 3, 2), C2f(w[2] + w[3], w[3])
        self.down5, self.n5 = cbs(w[3], w[3], 3, 2), C2f(w[3] + w[4], w[4])
        self.box = nn.ModuleList(nn.Sequential(cbs(c, 64, 3), cbs(64, 64, 3), nn.Conv2d(64, 4, 1))
                                 for c in (w[2], w[3], w[4]))
        self.cls = nn.ModuleList(nn.Sequential(cbs(c, 80, 3), cbs(80, 80, 3), nn.Conv2d(80, classes, 1))
                                 for c in (w[2], w[3], w[4]))

    def forward(self, x):
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        t4 = self.up4(torch.cat([F.interpolate(p5, scale_factor=2.0, mode="nearest"), p4], 1))
        t3 = self.up3(torch.cat([F.interpolate(t4, scale_factor=2.0, mode="nearest"), p3], 1))
        n4 = self.n4(torch.cat([self.down4(t3), t4], 1))
        n5 = self.n5(torch.cat([self.down5(n4), p5], 1))
        outs = [torch.cat([b(f), c(f).sigmoid()], 1).flatten(2) for f, b, c in zip((t3, n4, n5), self.box, self.cls)]
        return torch.cat(outs, 2)


class DetrStyle(nn.Module):
    """DETR: a ResNet backbone at a quarter of ResNet-18's width, a 1x1 projection, sine
    positions added, a 2+2-layer encoder-decoder transformer (d=128, 4 heads), 50 learned
    queries, class logits and sigmoid boxes."""

    def __init__(self, d=128, queries=50, classes=91, hw=(4, 4)):
        super().__init__()
        backbone = ResNet(widths=(16, 32, 64, 128), classes=1)
        self.backbone = nn.Sequential(backbone.stem, backbone.blocks)
        self.project = nn.Conv2d(128, d, 1)
        self.position = nn.Parameter(torch.randn(hw[0] * hw[1], 1, d) * 0.02)
        self.transformer = nn.Transformer(d, 4, 2, 2, 4 * d, dropout=0.0)
        self.queries = nn.Parameter(torch.randn(queries, 1, d))
        self.classes, self.boxes = nn.Linear(d, classes + 1), nn.Sequential(nn.Linear(d, d), nn.ReLU(),
                                                                              nn.Linear(d, 4))

    def forward(self, x):
        f = self.project(self.backbone(x))
        src = f.flatten(2).permute(2, 0, 1) + self.position
        tgt = self.queries.expand(-1, x.shape[0], -1)
        h = self.transformer(src, torch.zeros_like(tgt) + tgt).transpose(0, 1)
        return self.classes(h), self.boxes(h).sigmoid()


class UNet(nn.Module):
    """A 4-level U-Net (16-128 channels): ConvTranspose 2x2 up the decoder, the skip
    resized bilinearly to the decoder's size, as torch U-Net ports do for odd sizes."""

    def __init__(self, w=(16, 32, 64, 128), classes=2):
        super().__init__()
        self.down = nn.ModuleList()
        cin = 3
        for c in w:
            self.down.append(nn.Sequential(conv_bn(cin, c), conv_bn(c, c)))
            cin = c
        self.ups = nn.ModuleList(nn.ConvTranspose2d(w[i], w[i - 1], 2, 2) for i in range(len(w) - 1, 0, -1))
        self.merge = nn.ModuleList(nn.Sequential(conv_bn(2 * w[i - 1], w[i - 1]), conv_bn(w[i - 1], w[i - 1]))
                                   for i in range(len(w) - 1, 0, -1))
        self.head = nn.Conv2d(w[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, merge, skip in zip(self.ups, self.merge, reversed(skips[:-1])):
            x = up(x)
            skip = F.interpolate(skip, size=x.shape[2:], mode="bilinear", align_corners=False)
            x = merge(torch.cat([x, skip], 1))
        return self.head(x)


class CRNN(nn.Module):
    """A CRNN text recognizer (grey 32-pixel lines): VGG-like convolutions with (2, 1)
    pools, a 2-layer bidirectional LSTM (128 per direction) over the columns, 97 classes."""

    def __init__(self, classes=97):
        super().__init__()
        self.cnn = nn.Sequential(conv_bn(1, 32), nn.MaxPool2d(2), conv_bn(32, 64), nn.MaxPool2d(2),
                                 conv_bn(64, 128), conv_bn(128, 128), nn.MaxPool2d((2, 1)),
                                 conv_bn(128, 192), nn.MaxPool2d((2, 1)), conv_bn(192, 192, 2, 1, pad=0))
        self.rnn = nn.LSTM(192, 128, 2, bidirectional=True)
        self.fc = nn.Linear(256, classes)

    def forward(self, x):
        f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # [width, batch, channels]
        return self.fc(self.rnn(f)[0]).log_softmax(2)


def yolo(path):
    seeded()
    return export(YoloStyle(), [Feed("images", [1, 3, 256, 256])], path, ["output0"],
                  {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}})


def detr(path):
    seeded()
    return export(DetrStyle(), [Feed("pixel_values", [1, 3, 128, 128])], path, ["logits", "pred_boxes"],
                  {"pixel_values": {0: "batch"}, "logits": {0: "batch"}, "pred_boxes": {0: "batch"}})


def unet(path):
    seeded()
    return export(UNet(), [Feed("image", [1, 3, 128, 128])], path, ["mask"],
                  {"image": {0: "batch", 2: "height", 3: "width"}, "mask": {0: "batch", 2: "height", 3: "width"}})


def crnn(path):
    seeded()
    return export(CRNN(), [Feed("line", [1, 1, 32, 160])], path, ["log_probs"],
                  {"line": {0: "batch", 3: "width"}, "log_probs": {0: "columns", 1: "batch"}})


MODELS = [
    Spec("yolo_style", "YOLOv8-n-like detector: CSP (C2f) blocks, SiLU, SPPF, nearest Resize, decoupled box and "
         "class heads at 3 scales; 1x3x256x256, batch, height, width dynamic", "torchscript", yolo),
    Spec("detr_style", "DETR-like detector: quarter-width ResNet, 2+2-layer transformer (d=128), 50 queries; "
         "1x3x128x128, batch dynamic", "torchscript", detr),
    Spec("unet", "4-level U-Net (16-128 channels), ConvTranspose up, bilinear Resize of the skips; 1x3x128x128, "
         "batch, height, width dynamic", "torchscript", unet),
    Spec("crnn", "CRNN text recognizer: VGG-like convs, 2-layer BiLSTM (128), 97 classes; 1x1x32x160, batch and "
         "width dynamic", "torchscript", crnn),
]
