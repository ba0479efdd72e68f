"""The builders of benchmarks/build_corpus.py, one module per family of models.

Each family module has ``MODELS``: a list of ``Spec`` (corpus_models.spec), each a name,
a one-line description, the exporter and a function that writes the .onnx file and says
how to feed it. torch and transformers are imported only inside the torch families, so the
hand-made graphs build with onnx alone.
"""
