"""The trainer's errors that reach the command line (torch- and Ray-free, so the CLI can name them)."""


class TrainerRankError(RuntimeError):
    """A trainer rank died or failed; the message names the rank and the step. The step is lost; the
    run resumes from its last checkpoint (`run.resume=auto`)."""
