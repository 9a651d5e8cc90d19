"""`python -m experiments.classification`: see train.py."""

from experiments.classification.train import main

if __name__ == "__main__":
    main()
