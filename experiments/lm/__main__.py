"""`python -m experiments.lm`: see train.py."""

from experiments.lm.train import main

if __name__ == "__main__":
    main()
