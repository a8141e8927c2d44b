"""
The statistics of a comparison (compare.py): the paired difference of two arms' losses, its
confidence interval and p-value from Student's t distribution, and the verdict in words.

The t distribution is computed here, from the regularized incomplete beta function (Abramowitz
and Stegun 26.5.27 and 26.7.1: a two-sided tail of t with df degrees of freedom is
I_x(df/2, 1/2) at x = df / (df + t^2)), evaluated by its continued fraction (A&S 26.5.8) with
Lentz's method (Thompson and Barnett 1986), so that the command needs no scipy; the tests hold
it to scipy.stats.t.
"""

import math
from dataclasses import dataclass

LEVEL = 0.95  # the confidence of every interval
ALPHA = 0.05  # a difference is claimed where p is below this
TINY = 1e-300  # stands for a zero denominator in Lentz's method
EPS = 1e-15
MAX_TERMS = 10_000


def continued_fraction(a, b, x):
    """1 / (1 + d1 / (1 + d2 / (1 + ...))), the continued fraction of I_x(a, b) (A&S 26.5.8):
    d_2m = m (b - m) x / ((a + 2m - 1)(a + 2m)), d_2m+1 = -(a + m)(a + b + m) x / ((a + 2m)(a +
    2m + 1)). Modified Lentz: the convergents' ratio C/D is kept, never the convergents."""
    f = TINY
    c = f
    d = 0.0
    for j in range(1, MAX_TERMS):
        if j == 1:
            numerator = 1.0
        elif j % 2 == 0:
            m = (j - 2) // 2
            numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            m = (j - 1) // 2
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + numerator * d
        d = 1.0 / (d if d != 0 else TINY)
        c = 1.0 + numerator / c
        c = c if c != 0 else TINY
        step = c * d
        f *= step
        if abs(step - 1.0) < EPS:
            return f
    raise ArithmeticError(f"the continued fraction of I_x({a}, {b}) at x = {x} did not converge")


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    # x^a (1 - x)^b / (a B(a, b)), in logarithms: B(a, b) overflows for large a, b
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    log_front += a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    # the fraction converges fast below the mode's neighbourhood; the symmetry
    # I_x(a, b) = 1 - I_(1-x)(b, a) takes the other side there
    if x < (a + 1) / (a + b + 2):
        return front * continued_fraction(a, b, x) / a
    return 1.0 - front * continued_fraction(b, a, 1.0 - x) / b


def t_two_sided(t, df):
    """P(|T| >= |t|) for T of Student's t distribution with df degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2, 0.5, df / (df + t * t))


def t_cdf(t, df):
    """P(T <= t)."""
    tail = t_two_sided(t, df) / 2
    if t >= 0:
        return 1.0 - tail
    return tail


def t_quantile(q, df):
    """The t with P(T <= t) = q, for 0 < q < 1: the two-sided tail inverted by bisection."""
    if q == 0.5:
        return 0.0
    tail = 2 * min(q, 1 - q)
    high = 1.0
    while t_two_sided(high, df) > tail:
        high *= 2
    low = 0.0
    for _ in range(200):
        mid = (low + high) / 2
        if t_two_sided(mid, df) > tail:
            low = mid
        else:
            high = mid
        if high - low <= 1e-14 * high:
            break
    t = (low + high) / 2
    if q < 0.5:
        return -t
    return t


@dataclass
class Paired:
    """The paired differences d_i = b_i - a_i (of losses: negative is B better): their
    mean, sample standard deviation, the t statistic and two-sided p-value, and the interval
    of the mean at LEVEL. With one pair only the mean is known (the rest None)."""

    n: int
    mean: float
    sd: float | None
    t: float | None
    p: float | None
    low: float | None
    high: float | None

    @property
    def half_width(self):
        if self.low is None:
            return None
        return (self.high - self.low) / 2


def mean(values):
    return sum(values) / len(values)


def sample_sd(values):
    """The standard deviation with n - 1 in the denominator; None below 2 values."""
    if len(values) < 2:
        return None
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def paired(a, b, level=LEVEL):
    """Student's paired t test of b against a (sequences of the same length)."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    n = len(d)
    m = mean(d)
    if n < 2:
        return Paired(n, m, None, None, None, None, None)
    sd = sample_sd(d)
    if sd == 0:
        # every pair differs by the same amount: no spread to weigh it against
        p = 1.0 if m == 0 else 0.0
        return Paired(n, m, 0.0, math.copysign(math.inf, m) if m else 0.0, p, m, m)
    se = sd / math.sqrt(n)
    t = m / se
    half = t_quantile(0.5 + level / 2, n - 1) * se
    return Paired(n, m, sd, t, t_two_sided(t, n - 1), m - half, m + half)


def unpaired_sd(a, b):
    """The standard deviation of b_j - a_i over the runs of different pairs (i != j): the
    spread of a difference had the two runs not shared their seed. None below 2 pairs."""
    d = [y - x for i, x in enumerate(a) for j, y in enumerate(b) if i != j]
    if len(d) < 2:
        return None
    return sample_sd(d)


def pairs_to_resolve(sd, target, level=LEVEL, most=100_000):
    """The fewest pairs whose interval's half-width would be at most target, were the
    differences' standard deviation sd; None past most."""
    n = 2
    while n <= most:
        if t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n) <= target:
            return n
        n += 1 if n < 100 else n // 10
    return None


def p_text(p):
    """A p-value as a verdict writes it."""
    if p >= 0.001:
        return f"{p:.2g}"
    return f"{p:.1e}"


def verdict(result, alpha=ALPHA, level=LEVEL):
    """The verdict on a Paired of losses (b - a), in words."""
    n = result.n
    pairs = f"{n} pairs"
    if n == 1:
        pairs = "1 pair"
    if n < 2:
        return (
            f"1 pair: B - A = {result.mean:+.4f} nats; an interval needs 2 pairs at least (--pairs)"
        )
    if result.sd == 0 and result.mean == 0:
        return (
            f"no difference: the arms gave the same loss in each of the {pairs} "
            "(the change did not change training)"
        )
    confidence = f"{level:.0%} CI"
    if result.p < alpha:
        # in nats of loss, positive where B is better
        gain = -result.mean
        low, high = sorted((-result.high, -result.low))
        word = "better"
        if gain < 0:
            word = "worse"
            gain, low, high = -gain, -high, -low
        return (
            f"B is {word} by {gain:.4f} nats ({confidence} {low:.4f} to {high:.4f}, "
            f"p = {p_text(result.p)}, {pairs})"
        )
    half = result.half_width
    needed = pairs_to_resolve(result.sd, half / 2, level)
    more = f"about {needed:,} would resolve +/-{half / 2:.4f}"
    if needed is None:
        more = f"over 100,000 would be needed for +/-{half / 2:.4f}"
    return (
        f"no difference detected: {pairs} resolve +/-{half:.4f} nats here "
        f"(B - A = {result.mean:+.4f}, p = {p_text(result.p)}); {more}"
    )
