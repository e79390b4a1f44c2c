"""Speedup and the reuse budget K: the calibration K = alpha - beta / rho, where it comes from, and how it is held.

- `calibration`: `SpeedupCalibration` (the fitted curve) and `resolve` (a name, a file or an object -> a calibration);
- `files`: the packaged and user calibration files, and SeaCache-style threshold maps g(rho);
- `measure`: measuring the calibration on this machine (`morca calibrate`);
- `governor`: `SpeedupGovernor`, which corrects the requested speedup by what was realised.
"""
