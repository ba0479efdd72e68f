"""Models with real (random, not broadcast) weights at the sizes such models have, for
benchmarks: the onnx wheel's light models carry synthetic broadcast constants, which
flatter cache and load figures.

    python benchmarks/real_models.py [OUT_DIR]     # default: build/real-models

Writes (opset 17, weights from a seeded numpy Generator, so runs are byte-identical):
- resnet18.onnx    ResNet-18 layout, 1x3x224x224, BatchNorm already folded into the
                   convolutions (as an eval-mode PyTorch export does), 11.7M parameters
- mobilenetv2.onnx MobileNetV2 layout (width 1.0), 1x3x224x224, depthwise convolutions,
                   ReLU6 as Clip, 3.5M parameters
- bert.onnx        4-layer post-LN encoder, hidden 512, 8 heads, FFN 2048, 1x128 tokens
                   of hidden states in, Erf GELU, 12.6M parameters
- gpt2.onnx        4-layer pre-LN decoder, hidden 512, 8 heads, causal mask, Tanh GELU,
                   1x128 tokens of hidden states in
- gpt2_kv.onnx     gpt2's weights as a decoder's next-token step: one token of hidden
                   state in, each layer's past keys and values (1x8x127x64) in, its present
                   ones (1x8x128x64) out, as an export with a KV cache writes it
- bert_dynamic.onnx, gpt2_dynamic.onnx  the same weights with symbolic batch and sequence
                   axes, reshapes computed from the runtime shape (Shape, Gather,
                   Concat) as an export with dynamic axes writes them
- lstm.onnx        2-layer LSTM, hidden 256, input 128, 64 steps of batch 1 (the second
                   layer reads the first's Y, its direction axis squeezed), 0.9M parameters
- resnet50.onnx    (resnet50(), made on use by bench_native_compile.py and bench_peers.py)
                   ResNet-50 layout, 1x3x224x224, BatchNorm folded, 25.6M parameters
- bert_ort_fused.onnx (write_one(out, "bert_ort_fused"); needs onnxruntime) bert's weights
                   with an int64 attention_mask input (1x128), through onnxruntime's transformer
                   optimizer: four com.microsoft Attention ops, the other layers standard ONNX
- NAME_batchN.onnx (write_one(out, NAME, batch=N), NAME one of the conv models) the same
                   model and weights with a batch of N images
- large.onnx       (with --large) an MLP of 8 layers of 4096x4096: 537M bytes of weights,
                   for cache-hit cost against model size
"""

from __future__ import annotations

import math
import os
import pathlib
import sys

import numpy as np
from onnx import TensorProto, helper

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))
from make_fixtures import Builder, f32_input  # noqa: E402

MAX_SEQ = 512  # the longest sequence the dynamic decoder's causal mask covers


def _batched(name: str, batch: int) -> str:
    """The graph's name: a batch-1 model keeps its plain name, so its file stays byte-identical."""
    return name if batch == 1 else f"{name}_batch{batch}"


def resnet18(batch: int = 1):
    b = Builder(seed=2001)

    def conv(x, cin, cout, k, stride=1, relu=True):
        y = b.conv(x, cin, cout, k, stride=stride, bias=True)
        return b.op("Relu", [y]) if relu else y

    def block(x, cin, cout, stride):
        y = conv(x, cin, cout, 3, stride)
        y = conv(y, cout, cout, 3, 1, relu=False)
        short = conv(x, cin, cout, 1, stride, relu=False) if (stride != 1 or cin != cout) else x
        return b.op("Relu", [b.op("Add", [y, short])])

    x = conv("input", 3, 64, 7, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        x = block(x, cin, cout, stride)
        x = block(x, cout, cout, 1)
        cin = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    b.op("Gemm", [x, b.lecun((1000, 512), 512), b.small((1000,))], out="logits", transB=1)
    return b.model(_batched("resnet18", batch), [f32_input("input", [batch, 3, 224, 224])],
                   [f32_input("logits", [batch, 1000])], "ResNet-18 layout with BatchNorm folded, real random weights")


def resnet50(batch: int = 1):
    """ResNet-50 (v1.5: stride on the 3x3 convolution of each bottleneck), BatchNorm folded,
    1x3x224x224, 25.6M parameters. Not in MODELS: bench_native_compile.py and
    bench_peers.py make it on use."""
    b = Builder(seed=2005)

    def conv(x, cin, cout, k, stride=1, relu=True):
        y = b.conv(x, cin, cout, k, stride=stride, bias=True)
        return b.op("Relu", [y]) if relu else y

    def bottleneck(x, cin, width, stride):
        cout = width * 4
        y = conv(x, cin, width, 1)
        y = conv(y, width, width, 3, stride)
        y = conv(y, width, cout, 1, relu=False)
        short = conv(x, cin, cout, 1, stride, relu=False) if (stride != 1 or cin != cout) else x
        return b.op("Relu", [b.op("Add", [y, short])])

    x = conv("input", 3, 64, 7, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            x = bottleneck(x, cin, width, stride if i == 0 else 1)
            cin = width * 4
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    b.op("Gemm", [x, b.lecun((1000, 2048), 2048), b.small((1000,))], out="logits", transB=1)
    return b.model(_batched("resnet50", batch), [f32_input("input", [batch, 3, 224, 224])],
                   [f32_input("logits", [batch, 1000])], "ResNet-50 layout with BatchNorm folded, real random weights")


def mobilenetv2(batch: int = 1):
    b = Builder(seed=2002)

    def conv(x, cin, cout, k, stride=1, group=1, act=True):
        y = b.conv(x, cin, cout, k, stride=stride, group=group, bias=True)
        return b.relu6(y) if act else y

    x = conv("input", 3, 32, 3, 2)
    cin = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = conv(x, cin, hidden, 1) if t != 1 else x
            y = conv(y, hidden, hidden, 3, stride, group=hidden)
            y = conv(y, hidden, c, 1, act=False)
            x = b.op("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = conv(x, cin, 1280, 1)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    b.op("Gemm", [x, b.lecun((1000, 1280), 1280), b.small((1000,))], out="logits", transB=1)
    return b.model(_batched("mobilenetv2", batch), [f32_input("input", [batch, 3, 224, 224])],
                   [f32_input("logits", [batch, 1000])],
                   "MobileNetV2 layout, depthwise convolutions, ReLU6 as Clip, real random weights")


def _transformer(name, seed, causal, seq=128, d=512, heads=8, ff=2048, layers=4, dynamic=False,
                 kv_cache=False, padding_mask=False):
    """``dynamic``: batch and sequence length are symbolic input dimensions, and every
    reshape target and the causal mask are computed from the runtime shape, as
    torch.onnx.export writes a model exported with dynamic axes. ``kv_cache``: one new
    token (the seq-th) attends to itself and to seq - 1 past keys and values per layer,
    which are inputs; the keys and values with the new token's appended are outputs.
    ``padding_mask``: an int64 attention_mask input (1 keep, 0 padding) made the scores'
    additive -10000 bias, and the scores divided by sqrt(head size), as a Hugging Face BERT
    export writes them (the form onnxruntime's transformer optimizer recognises)."""
    b = Builder(seed=seed)
    dh = d // heads
    padding_bias = None
    if padding_mask:  # [B, S] -> [B, 1, 1, S]: (1 - mask) * -10000
        wide = b.op("Unsqueeze", [b.op("Unsqueeze", ["attention_mask", b.i64([1], "axes")]), b.i64([2], "axes")])
        hidden = b.op("Sub", [b.f32(1.0), b.op("Cast", [wide], to=1)])
        padding_bias = b.op("Mul", [hidden, b.f32(-10000.0)])

    def runtime_dims(t, *axes):  # [t.shape[a] for a in axes] as 1-element int64 tensors
        shape = b.op("Shape", [t])
        return [b.op("Unsqueeze", [b.op("Gather", [shape, b.i64(a, "axis")], axis=0), b.i64([0], "axes")])
                for a in axes]

    def reshape(t, tail):  # keep t's first two dimensions, then ``tail``
        if not dynamic:
            return b.op("Reshape", [t, b.i64([0, 0, *tail])])
        return b.op("Reshape", [t, b.op("Concat", [*runtime_dims(t, 0, 1), b.i64(tail)], axis=0)])

    def linear(x, fin, fout):
        return b.op("Add", [b.op("MatMul", [x, b.lecun((fin, fout), fin)]), b.small((fout,))])

    def layer_norm(x):
        scale = b.const(b.rng.uniform(0.8, 1.2, d).astype(np.float32), "ln_scale")
        return b.op("LayerNormalization", [x, scale, b.small((d,), 0.05, "ln_bias")], axis=-1, epsilon=1e-5)

    def split_heads(t, perm):
        return b.op("Transpose", [reshape(t, [heads, dh])], perm=perm)

    past = []  # (past key, past value, present key, present value) per layer, for kv_cache

    def cached_attention(x):  # the new token's query against the past keys and its own
        q, k, v = (split_heads(linear(x, d, d), [0, 2, 1, 3]) for _ in range(3))
        i = len(past)
        names = (f"past_key_{i}", f"past_value_{i}", f"present_key_{i}", f"present_value_{i}")
        key = b.op("Concat", [names[0], k], axis=2, out=names[2])
        value = b.op("Concat", [names[1], v], axis=2, out=names[3])
        past.append(names)
        scores = b.op("MatMul", [q, b.op("Transpose", [key], perm=[0, 1, 3, 2])])
        scores = b.op("Mul", [scores, b.f32(1.0 / math.sqrt(dh))])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), value])
        return linear(reshape(b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), [d]), d, d)

    def attention(x):
        if kv_cache:
            return cached_attention(x)
        q, k, v = (linear(x, d, d) for _ in range(3))
        scores = b.op("MatMul", [split_heads(q, [0, 2, 1, 3]), split_heads(k, [0, 2, 3, 1])])
        if padding_bias is not None:
            scores = b.op("Add", [b.op("Div", [scores, b.f32(math.sqrt(dh))]), padding_bias])
        else:
            scores = b.op("Mul", [scores, b.f32(1.0 / math.sqrt(dh))])
        if causal and not dynamic:
            mask = np.triu(np.full((seq, seq), -1e9, np.float32), 1)
            scores = b.op("Add", [scores, b.const(mask, "causal_mask")])
        elif causal:  # the top-left [seq, seq] corner of a mask for the longest sequence
            mask = b.const(np.triu(np.full((MAX_SEQ, MAX_SEQ), -1e9, np.float32), 1), "causal_mask")
            length = runtime_dims(x, 1)[0]
            zero = b.i64([0], "start")
            mask = b.op("Slice", [mask, b.op("Concat", [zero, zero], axis=0),
                                  b.op("Concat", [length, length], axis=0)])
            scores = b.op("Add", [scores, mask])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), split_heads(v, [0, 2, 1, 3])])
        ctx = reshape(b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), [d])
        return linear(ctx, d, d)

    def gelu_erf(x):
        inner = b.op("Erf", [b.op("Div", [x, b.f32(math.sqrt(2.0))])])
        return b.op("Mul", [b.op("Mul", [x, b.f32(0.5)]), b.op("Add", [inner, b.f32(1.0)])])

    def gelu_tanh(x):
        inner = b.op("Add", [x, b.op("Mul", [b.op("Pow", [x, b.f32(3.0)]), b.f32(0.044715)])])
        t = b.op("Tanh", [b.op("Mul", [inner, b.f32(math.sqrt(2.0 / math.pi))])])
        return b.op("Mul", [b.op("Mul", [x, b.f32(0.5)]), b.op("Add", [t, b.f32(1.0)])])

    x = "hidden_in"
    for _ in range(layers):
        if causal:  # pre-LN, as GPT-2
            x = b.op("Add", [x, attention(layer_norm(x))])
            x = b.op("Add", [x, linear(gelu_tanh(linear(layer_norm(x), d, ff)), ff, d)])
        else:  # post-LN, as BERT
            x = layer_norm(b.op("Add", [x, attention(x)]))
            x = layer_norm(b.op("Add", [x, linear(gelu_erf(linear(x, d, ff)), ff, d)]))
    if causal:
        x = layer_norm(x)
    b.op("Identity", [x], out="hidden_out")
    shape = ["batch", "seq", d] if dynamic else [1, 1 if kv_cache else seq, d]
    inputs, outputs = [f32_input("hidden_in", shape)], [f32_input("hidden_out", shape)]
    if padding_mask:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, shape[:2]))
    for past_key, past_value, present_key, present_value in past:
        inputs += [f32_input(past_key, [1, heads, seq - 1, dh]), f32_input(past_value, [1, heads, seq - 1, dh])]
        outputs += [f32_input(present_key, [1, heads, seq, dh]), f32_input(present_value, [1, heads, seq, dh])]
    return b.model(name, inputs, outputs,
                   f"{layers}-layer {'decoder' if causal else 'encoder'}, hidden {d}, real random weights"
                   + (", dynamic batch and sequence axes" if dynamic else "")
                   + (f", the next-token step after {seq - 1} cached tokens" if kv_cache else ""))


def bert():
    return _transformer("bert", 2003, causal=False)


def gpt2():
    return _transformer("gpt2", 2004, causal=True)


def gpt2_kv():
    return _transformer("gpt2_kv", 2004, causal=True, kv_cache=True)


def bert_dynamic():
    return _transformer("bert_dynamic", 2003, causal=False, dynamic=True)


def gpt2_dynamic():
    return _transformer("gpt2_dynamic", 2004, causal=True, dynamic=True)


def lstm(seq: int = 64, inp: int = 128, hidden: int = 256, layers: int = 2):
    """Stacked LSTMs as a speech or time-series export writes them: each layer's Y
    [seq, 1, 1, hidden] squeezed to the next one's X, the last one's final states out."""
    b = Builder(seed=2006)
    x, size = "x", inp
    for _ in range(layers):
        w = b.lecun((1, 4 * hidden, size), size)
        r = b.lecun((1, 4 * hidden, hidden), hidden)
        bias = b.small((1, 8 * hidden))
        y, y_h, y_c = b.op("LSTM", [x, w, r, bias], n_out=3, hidden_size=hidden)
        x, size = b.op("Squeeze", [y, b.i64([1])]), hidden
    b.op("Identity", [x], out="y")
    b.op("Identity", [y_h], out="h")
    b.op("Identity", [y_c], out="c")
    return b.model("lstm", [f32_input("x", [seq, 1, inp])],
                   [f32_input("y", [seq, 1, hidden]), f32_input("h", [1, 1, hidden]), f32_input("c", [1, 1, hidden])],
                   f"{layers}-layer LSTM, hidden {hidden}, input {inp}, {seq} steps, real random weights")


def ort_fused(model, heads: int, hidden: int):
    """``model`` through onnxruntime's transformer optimizer for BERT: each attention becomes one
    com.microsoft Attention (packed Q/K/V weights, the mask as per-row sequence lengths). Its
    other fusions (SkipLayerNormalization, BiasGelu, ...) write contrib ops nncc has no kernels
    for, so they are off: those layers stay standard ONNX."""
    import tempfile

    import onnx
    from onnxruntime.transformers.fusion_options import FusionOptions  # lazy: benchmark peer
    from onnxruntime.transformers.optimizer import optimize_model  # lazy: benchmark peer

    options = FusionOptions("bert")
    for other in ("enable_gelu", "enable_layer_norm", "enable_skip_layer_norm", "enable_bias_skip_layer_norm",
                  "enable_bias_gelu", "enable_gelu_approximation", "enable_embed_layer_norm"):
        setattr(options, other, False)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save(model, path)
        return optimize_model(path, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0,
                              optimization_options=options).model


def bert_ort_fused():
    """bert's weights with a padding mask, through onnxruntime's transformer optimizer
    (ort_fused): the model onnxruntime's users ship, four com.microsoft Attention ops."""
    model = ort_fused(_transformer("bert_ort_fused", 2003, causal=False, padding_mask=True), 8, 512)
    ops = [n.op_type for n in model.graph.node if n.domain == "com.microsoft"]
    if ops != ["Attention"] * 4:
        raise RuntimeError(f"onnxruntime's optimizer wrote {ops}, not four com.microsoft Attention ops")
    return model


def large():
    """537 MB of weights: the cache's cost on a hit must not grow with this."""
    b = Builder(seed=2005)
    x = "x"
    for _ in range(8):
        x = b.op("Relu", [b.op("MatMul", [x, b.lecun((4096, 4096), 4096)])])
    b.op("Identity", [x], out="y")
    graph = helper.make_graph(b.nodes, "large", [f32_input("x", [1, 4096])], [f32_input("y", [1, 4096])],
                              initializer=b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


CONV_MODELS = {"resnet18": resnet18, "resnet50": resnet50, "mobilenetv2": mobilenetv2}  # take batch=N

MODELS = {"resnet18": resnet18, "mobilenetv2": mobilenetv2, "bert": bert, "gpt2": gpt2, "gpt2_kv": gpt2_kv,
          "bert_dynamic": bert_dynamic, "gpt2_dynamic": gpt2_dynamic, "lstm": lstm}
ORT_MODELS = {"bert_ort_fused": bert_ort_fused}  # made with onnxruntime: by name only, not in write_all


def write_all(out_dir: str, with_large: bool = False) -> list[str]:
    import onnx

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    makers = dict(MODELS, **({"large": large} if with_large else {}))
    for name, make in makers.items():
        path = os.path.join(out_dir, f"{name}.onnx")
        if not os.path.exists(path):
            onnx.save(make(), path)
        paths.append(path)
    return paths


def write_one(out_dir: str, name: str, batch: int = 1) -> str:
    """One model of CONV_MODELS or MODELS (``batch``: conv models only) as OUT_DIR/NAME.onnx,
    or NAME_batchN.onnx; written on first use."""
    import onnx

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{_batched(name, batch)}.onnx")
    if not os.path.exists(path):
        onnx.save(CONV_MODELS[name](batch) if name in CONV_MODELS else dict(MODELS, **ORT_MODELS)[name](), path)
    return path


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--large"]
    for p in write_all(args[0] if args else str(ROOT / "build" / "real-models"), "--large" in sys.argv):
        print(p, os.path.getsize(p))
