"""`python -m experiments.retrieval`: see train.py."""

from experiments.retrieval.train import main

if __name__ == "__main__":
    main()
