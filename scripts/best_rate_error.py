"""False-verdict rates and power of best-rate comparisons by simulation (docs/claims.md, best rate):
the whole --decide look sequence on issue 52's coarse grids, read at every pairing of near-best rates
(ablate/claims/best_rate_bounds.py) and at the chosen rates alone. Run from the repository root:
`PYTHONPATH=. python scripts/best_rate_error.py [SEQUENCES]` (default 4000; about a minute on 2 cores)."""
import sys, math
import tests.ablate.claims.test_best_rate_bounds as t
from ablate.claims.verdict import AGREES, DISAGREES
if len(sys.argv) > 1 and not (sys.argv[1].isdigit() and int(sys.argv[1]) > 0):
    print(f"best_rate_error.py: SEQUENCES {sys.argv[1]!r}; valid: a positive whole number (default 4000)",
          file=sys.stderr)
    sys.exit(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
se = lambda p: math.sqrt(p * (1 - p) / n)
for gap, noise in [(0.01, 0.02), (0.02, 0.025), (0.03, 0.03)]:
    curve = [2.50, 2.50 + gap, 2.70]
    for expect in ("lower", "higher"):
        new = t._rate(AGREES, curve, curve, noise, expect=expect, seed=100 + int(gap * 1000), n=n)
        old = t._rate(AGREES, curve, curve, noise, rivals=False, expect=expect, seed=100 + int(gap * 1000), n=n)
        print(f"null, gap {gap} noise {noise} expect {expect}: false agrees {new:.4f} (se {se(new):.4f}); chosen rates alone {old:.4f} (se {se(old):.4f})", flush=True)
gen = t._rate(AGREES, [2.5, 2.52, 2.7], [2.5, 2.52, 2.7], 0.025, monotone=False, seed=120, n=n)
print(f"null, every pairing (measure not minimised by the best rate): {gen:.4f} (se {se(gen):.4f})")
a, b = [2.48, 2.49, 2.68], [2.50, 2.51, 2.70]
print(f"at the effect 0.02: false 'no effect as large' {t._rate(DISAGREES, a, b, 0.025, seed=111, n=n):.4f}; alone {t._rate(DISAGREES, a, b, 0.025, rivals=False, seed=111, n=n):.4f}")
for d in (0.02, 0.03, 0.05):
    a = [2.50 - d, 2.52 - d, 2.70 - d]; b = [2.50, 2.52, 2.70]
    print(f"power, best rates {d} apart (near rates 0.02 apart, noise 0.025): with pairings {t._rate(AGREES, a, b, 0.025, seed=7, n=n//2):.3f}; alone {t._rate(AGREES, a, b, 0.025, rivals=False, seed=7, n=n//2):.3f}", flush=True)
