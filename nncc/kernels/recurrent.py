"""Recurrent kernels: GRU, LSTM, RNN."""
