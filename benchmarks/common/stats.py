"""The statistics every benchmark's tables print, for the Python drivers and peers: the same
definitions as stats.h beside this file (see Note [Paired statistics] there), so that a figure
means the same in a C++ table and a Python one.

A script in a folder beside this one imports it as

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
    from stats import median  # noqa: E402
"""


def median(values, when_empty=0.0):
    """The middle of the sorted values; of an even count, the mean of the two middle ones.
    `when_empty` for no values at all (0.0, or what a table prints as "none")."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        return when_empty
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def spread(values, when_empty=0.0):
    """The smallest and the largest value, (min, max): the spread a table prints beside a median
    as "median [min-max]". Both `when_empty` for no values."""
    v = list(values)
    return (min(v), max(v)) if v else (when_empty, when_empty)


def paired_ratios(a, b):
    """a[i] / b[i] for each pair of samples that ran side by side; a sample of the longer list
    without a partner, and a pair whose b[i] is not positive (nothing measured), are left out."""
    return [x / y for x, y in zip(a, b) if y > 0]


def paired_ratio(a, b, when_empty=0.0):
    """The ratio a table prints for two interleaved series: the median of their paired ratios."""
    return median(paired_ratios(a, b), when_empty)


def median_spread(values, digits=3):
    """ "median [min-max]" of `values`, each with `digits` decimals."""
    v = list(values)
    lo, hi = spread(v)
    return f"{median(v):.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"
