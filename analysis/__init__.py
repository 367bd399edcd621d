"""Reads run directories: loading, stability metrics, statistics, plots, reports."""
