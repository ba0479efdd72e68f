# bash completion for nncc: `_NNCC_COMPLETE=bash_source nncc`, written by
# completions/generate.py. Do not edit; install as README.md says (Shell completion).
_nncc_completion() {
    local IFS=$'\n'
    local response

    response=$(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD=$COMP_CWORD _NNCC_COMPLETE=bash_complete $1)

    for completion in $response; do
        IFS=',' read type value <<< "$completion"

        if [[ $type == 'dir' ]]; then
            COMPREPLY=()
            compopt -o dirnames
        elif [[ $type == 'file' ]]; then
            COMPREPLY=()
            compopt -o default
        elif [[ $type == 'plain' ]]; then
            COMPREPLY+=($value)
        fi
    done

    return 0
}

_nncc_completion_setup() {
    complete -o nosort -F _nncc_completion nncc
}

_nncc_completion_setup;
