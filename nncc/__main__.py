from nncc.cli.main import main

main()
