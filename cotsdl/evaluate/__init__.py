"""Evaluation: the paper's face-selectivity experiment with honest scoring, controls, figures and a report."""
