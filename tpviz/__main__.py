from tpviz.cli.main import leave, main

if __name__ == "__main__":
    leave(main())
