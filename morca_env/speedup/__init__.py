"""Speedup and the reuse budget K: the calibration K = alpha - beta / rho, where it comes from, and how it is held.

- `calibration`: `SpeedupCalibration` (the fitted curve) and the rounding of K;
- `files`: the packaged and user calibration files, `resolve` (a name, a file or an object -> a calibration), and the
  threshold maps g(rho) of the rules that spend their own K;
- `measure`: measuring the calibration on this machine (`morca calibrate`);
- `governor`: `SpeedupGovernor`, which corrects the requested speedup by what was realised.
"""

from .calibration import SpeedupCalibration
from .files import resolve

__all__ = ["SpeedupCalibration", "resolve"]
