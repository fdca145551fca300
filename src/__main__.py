"""``python -m ndplan``: the same command line as the ``ndplan`` script."""

from ndplan.cli.launch import main

if __name__ == "__main__":
    main()
