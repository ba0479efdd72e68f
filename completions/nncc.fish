# fish completion for nncc. Install: copy to ~/.config/fish/completions/.
#
# fish loads this file on the first completion of `nncc`. It asks the installed nncc for
# click's completion script (`_NNCC_COMPLETE=fish_source nncc`), so the script always
# speaks the protocol of the click that nncc runs with.
env _NNCC_COMPLETE=fish_source nncc 2>/dev/null | source
