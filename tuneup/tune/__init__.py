"""`tuneup tune`: short, supervised trials of the user's training command, searched with the step-time model
and confirmed with the compare rule (tuneup.tune.session). No torch here: the trials import it, the tuner
reads their records."""
