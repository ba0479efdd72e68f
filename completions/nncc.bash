# bash completion for nncc. Install: `source /path/to/completions/nncc.bash` in ~/.bashrc.
#
# On the first TAB after `nncc` this asks the installed nncc for click's completion script
# (`_NNCC_COMPLETE=bash_source nncc`) and hands over to it, so the script always speaks the
# protocol of the click that nncc runs with, and a shell start costs nothing.
_nncc_completion_load() {
    eval "$(_NNCC_COMPLETE=bash_source nncc 2>/dev/null)" || return 0
    # click's script has now registered its _nncc_completion for nncc: answer this TAB too
    if declare -F _nncc_completion >/dev/null; then
        unset -f _nncc_completion_load
        _nncc_completion "$@"
    fi
}
complete -o nosort -F _nncc_completion_load nncc 2>/dev/null || complete -F _nncc_completion_load nncc
