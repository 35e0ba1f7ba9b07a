"""Evaluation: the accuracy of a sampler on a task split, greedy or by vote over sampled queries,
and the statistics of accuracies (Wilson intervals, paired differences).

The bottom layer of `autoresearch`: may import `rewards` and `sqltasks`, nothing of its own
package.
"""
