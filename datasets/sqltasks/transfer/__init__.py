"""The hand-written transfer split: questions on application databases the corpus never shows."""
