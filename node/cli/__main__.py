"""``python -m node.cli``: how servers and simulated clients are started as processes."""

from node.cli import main

if __name__ == "__main__":
    main()
