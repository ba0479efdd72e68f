"""Speech, recurrent and tabular models: a Whisper-style encoder (two Conv1d with GELU,
the second strided, sinusoidal positions, pre-norm transformer layers), LSTM and GRU
models that carry their state in and out, and tabular MLPs (batch-normalized, and one
with categorical embeddings)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from corpus_models.spec import Feed, Spec
from corpus_models.torch_export import export, seeded


class WhisperStyleEncoder(nn.Module):
    """Whisper-tiny's encoder shape (80 mel bins, d=384, 6 heads) at 2 of its 4 layers;
    positions computed for any length up to 1500 frames and sliced to the input's."""

    def __init__(self, mels=80, d=384, heads=6, layers=2, max_frames=1500):
        super().__init__()
        self.conv1 = nn.Conv1d(mels, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        t = torch.arange(max_frames)[:, None] * torch.exp(-math.log(10000) * torch.arange(d // 2) / (d // 2 - 1))
        self.register_buffer("positions", torch.cat([t.sin(), t.cos()], 1))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        x = x + self.positions[: x.shape[1]]
        return self.norm(self.layers(x))


class StatefulRNN(nn.Module):
    """A streaming acoustic model: a projection, a 2-layer LSTM or GRU whose state is an
    input and an output (a caller feeds it back chunk after chunk), per-frame classes."""

    def __init__(self, kind="lstm", features=40, hidden=128, classes=32):
        super().__init__()
        self.kind = kind
        self.project = nn.Linear(features, hidden)
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(hidden, hidden, 2, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x, *state):
        y, new = self.rnn(torch.relu(self.project(x)), state if self.kind == "lstm" else state[0])
        return (self.fc(y), *new) if self.kind == "lstm" else (self.fc(y), new)


class TabularMLP(nn.Module):
    """A tabular classifier: 3 blocks of Linear, BatchNorm1d, ReLU, Dropout (256-128-64)."""

    def __init__(self, features=64, widths=(256, 128, 64), classes=2):
        super().__init__()
        layers, cin = [], features
        for w in widths:
            layers += [nn.Linear(cin, w), nn.BatchNorm1d(w), nn.ReLU(), nn.Dropout(0.1)]
            cin = w
        self.body, self.head = nn.Sequential(*layers), nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.body(x)).softmax(-1)


class TabularEmbeddings(nn.Module):
    """Categorical columns through their own embedding tables, concatenated with the
    numeric columns, then an MLP (a wide-and-deep style recommender)."""

    def __init__(self, cardinalities=(100, 50, 20, 1000), dim=16, numeric=13):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(c, dim) for c in cardinalities)
        self.mlp = nn.Sequential(nn.Linear(dim * len(cardinalities) + numeric, 128), nn.ReLU(), nn.Linear(128, 64),
                                 nn.ReLU(), nn.Linear(64, 1))

    def forward(self, categorical, numeric):
        parts = [t(categorical[:, i]) for i, t in enumerate(self.tables)]
        return torch.sigmoid(self.mlp(torch.cat(parts + [numeric], 1)))


def whisper(dynamo=False):
    def build(path):
        seeded()
        return export(WhisperStyleEncoder(), [Feed("input_features", [1, 80, 400])], path, ["last_hidden_state"],
                      {"input_features": {0: "batch", 2: "frames"}, "last_hidden_state": {0: "batch", 1: "steps"}},
                      dynamo=dynamo)
    return build


def rnn(kind):
    def build(path):
        seeded()
        feeds = [Feed("x", [1, 50, 40]), Feed("h0", [2, 1, 128])] + ([Feed("c0", [2, 1, 128])] if kind == "lstm"
                                                                     else [])
        outputs = ["y", "hn"] + (["cn"] if kind == "lstm" else [])
        dynamic = {"x": {0: "batch", 1: "time"}, "h0": {1: "batch"}, "c0": {1: "batch"}, "y": {0: "batch", 1: "time"},
                   "hn": {1: "batch"}, "cn": {1: "batch"}}
        return export(StatefulRNN(kind), feeds, path, outputs, dynamic)
    return build


def mlp(dynamo=False):
    def build(path):
        seeded()
        return export(TabularMLP(), [Feed("features", [32, 64])], path, ["probabilities"],
                      {"features": {0: "batch"}, "probabilities": {0: "batch"}}, dynamo=dynamo)
    return build


def embeddings(path):
    seeded()
    feeds = [Feed("categorical", [32, 4], "int64", 0, 20), Feed("numeric", [32, 13])]
    return export(TabularEmbeddings(), feeds, path, ["score"],
                  {"categorical": {0: "batch"}, "numeric": {0: "batch"}, "score": {0: "batch"}})


MODELS = [
    Spec("whisper_style_encoder", "Whisper-tiny-shaped encoder (80 mels, d=384, 6 heads), 2 of 4 layers: Conv1d, "
         "strided Conv1d, GELU, pre-norm attention; 1x80x400, batch and frames dynamic", "torchscript", whisper()),
    Spec("whisper_style_encoder_dynamo", "the same encoder through the dynamo exporter", "dynamo", whisper(True)),
    Spec("lstm_stateful", "streaming 2-layer LSTM (128) with h/c in and out, 40 features, 32 classes; 1x50x40, "
         "batch and time dynamic", "torchscript", rnn("lstm")),
    Spec("gru_stateful", "streaming 2-layer GRU (128) with h in and out; 1x50x40, batch and time dynamic",
         "torchscript", rnn("gru")),
    Spec("tabular_mlp", "tabular MLP 64-256-128-64-2 with BatchNorm1d and softmax; 32x64, batch dynamic",
         "torchscript", mlp()),
    Spec("tabular_mlp_dynamo", "the same MLP through the dynamo exporter", "dynamo", mlp(True)),
    Spec("tabular_embeddings", "4 categorical embedding tables (16-d) with 13 numeric columns, MLP 77-128-64-1; "
         "int64 categories, 32 rows, batch dynamic", "torchscript", embeddings),
]
