"""Transformers as Hugging Face's transformers builds them, from a config with random
weights (``from_config``: nothing is downloaded), at reduced widths and depths (each
says which), exported with the model's own attention implementation (its default)."""

from __future__ import annotations

import torch
from torch import nn

from corpus_models.spec import Feed, Spec
from corpus_models.torch_export import export, seeded

VOCAB = 8000
SEQ = 64


class Outputs(nn.Module):
    """The wrapper users export: positional tensors in, the named inputs the model's
    forward takes, and its named outputs out as plain tensors."""

    def __init__(self, model, inputs, names):
        super().__init__()
        self.model, self.inputs, self.names = model, inputs, names

    def forward(self, first, second=None, third=None):  # named: torch.export binds shapes to parameters
        out = self.model(**dict(zip(self.inputs, (first, second, third))))
        return tuple(getattr(out, n) for n in self.names)


def text_model(config_of, model_of, inputs=("input_ids", "attention_mask"), output="last_hidden_state",
               dynamo=False):
    def build(path):
        import transformers

        seeded()
        config = getattr(transformers, config_of[0])(**config_of[1])
        model = getattr(transformers, model_of).from_config(config) if model_of.startswith("Auto") else \
            getattr(transformers, model_of)(config)
        feeds = [Feed(name, [1, SEQ], "int64", 0, VOCAB if name == "input_ids" else 2,
                      fill=1 if name == "attention_mask" else None) for name in inputs]
        dynamic = {name: {0: "batch", 1: "sequence"} for name in list(inputs) + [output]}
        return export(Outputs(model, list(inputs), [output]), feeds, path, [output], dynamic, dynamo=dynamo)
    return build


def image_model(config_of, model_of, size):
    def build(path):
        import transformers

        seeded()
        model = getattr(transformers, model_of)(getattr(transformers, config_of[0])(**config_of[1]))
        return export(Outputs(model, ["pixel_values"], ["pooler_output"]), [Feed("pixel_values", [1, 3, size, size])],
                      path, ["pooler_output"], {"pixel_values": {0: "batch"}, "pooler_output": {0: "batch"}})
    return build


SMALL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
BERT = ("BertConfig", dict(vocab_size=VOCAB, max_position_embeddings=512, **SMALL))
DISTILBERT = ("DistilBertConfig", dict(vocab_size=VOCAB, dim=256, n_layers=4, n_heads=4, hidden_dim=1024))
GPT2 = ("GPT2Config", dict(vocab_size=VOCAB, n_embd=256, n_layer=4, n_head=4, n_positions=512, use_cache=False,
                           bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1))
LLAMA = ("LlamaConfig", dict(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                             num_key_value_heads=4, intermediate_size=688, max_position_embeddings=512,
                             use_cache=False))
T5 = ("T5Config", dict(vocab_size=VOCAB, d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_heads=8,
                       feed_forward_proj="gated-gelu"))
VIT = ("ViTConfig", dict(image_size=96, patch_size=16, **SMALL))
SWIN = ("SwinConfig", dict(image_size=224, patch_size=4, window_size=7, embed_dim=48, depths=[1, 1, 2, 1],
                           num_heads=[2, 4, 8, 16]))

MODELS = [
    Spec("bert", "BERT (hidden 256, 4 layers, 4 heads, vocab 8000), ids and mask 1x64; batch and sequence dynamic",
         "torchscript", text_model(BERT, "BertModel", ("input_ids", "attention_mask", "token_type_ids"))),
    Spec("bert_dynamo", "the same BERT through the dynamo exporter", "dynamo",
         text_model(BERT, "BertModel", ("input_ids", "attention_mask", "token_type_ids"), dynamo=True)),
    Spec("distilbert", "DistilBERT (dim 256, 4 layers, 4 heads), ids and mask 1x64; batch and sequence dynamic",
         "torchscript", text_model(DISTILBERT, "DistilBertModel")),
    Spec("gpt2", "GPT-2 LM head (n_embd 256, 4 layers, 4 heads, no KV cache), ids and mask 1x64 (without a mask "
         "transformers traces aten::diff, which has no ONNX form); batch and sequence dynamic", "torchscript",
         text_model(GPT2, "GPT2LMHeadModel", ("input_ids", "attention_mask"), "logits")),
    Spec("gpt2_dynamo", "the same GPT-2 through the dynamo exporter", "dynamo",
         text_model(GPT2, "GPT2LMHeadModel", ("input_ids", "attention_mask"), "logits", dynamo=True)),
    Spec("llama", "LLaMA causal LM (hidden 256, 4 layers, 8 heads, 4 KV heads, RMSNorm, rotary, SwiGLU), ids and "
         "mask 1x64; batch and sequence dynamic", "torchscript",
         text_model(LLAMA, "LlamaForCausalLM", ("input_ids", "attention_mask"), "logits")),
    Spec("llama_dynamo", "the same LLaMA through the dynamo exporter", "dynamo",
         text_model(LLAMA, "LlamaForCausalLM", ("input_ids", "attention_mask"), "logits", dynamo=True)),
    Spec("t5_encoder", "T5 v1.1-style encoder (d 256, 4 layers, 8 heads, gated GELU, relative position bias), ids "
         "and mask 1x64; batch and sequence dynamic", "torchscript", text_model(T5, "T5EncoderModel")),
    Spec("vit", "ViT (hidden 256, 4 layers, patch 16, 96x96 image); batch dynamic", "torchscript",
         image_model(VIT, "ViTModel", 96)),
    Spec("swin", "Swin (embed 48, depths 1-1-2-1, window 7, 224x224 image): shifted windows, patch merging; "
         "batch dynamic", "torchscript", image_model(SWIN, "SwinModel", 224)),
]
