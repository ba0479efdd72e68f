from nncc.cli.main import program

program()
