"""Thread counts that cannot oversubscribe: the default leaves busy cores alone and splits the rest among workers."""

import pytest

from morca_env.utils import threads


def test_default_uses_free_cores_split_among_workers(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.setattr(threads, "busy_cores", lambda: 2)
    assert threads.choose_threads(None, workers=1)[0] == 6
    assert threads.choose_threads(None, workers=2)[0] == 3
    assert threads.choose_threads(None, workers=7)[0] == 1  # never below one
    monkeypatch.setattr(threads, "busy_cores", lambda: 30)  # a loaded machine: one thread, not zero
    assert threads.choose_threads(None, workers=1)[0] == 1


def test_two_cores_with_one_busy_gives_one_thread(monkeypatch):
    """The measured collapse: 2 threads beside one busy process ran offline IQL 20-75x slower."""
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores", lambda: 1)
    count, why = threads.choose_threads()
    assert count == 1 and "1 busy" in why


def test_requested_threads_win_and_bad_values_name_the_range(monkeypatch, caplog):
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    assert threads.choose_threads(3)[0] == 3
    assert "oversubscribed" in caplog.text
    with pytest.raises(ValueError, match="threads=0 must be a positive integer .*2 cores"):
        threads.choose_threads(0)
    with pytest.raises(ValueError, match="workers=0"):
        threads.choose_threads(None, workers=0)


def test_configure_sets_torch(monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        assert threads.configure_threads(1, quiet=True) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_busy_cores_sees_a_busy_process_at_once():
    """The 1-minute load average would miss a job started a second ago; /proc/stat sampling does not."""
    import multiprocessing as mp
    import os

    if not os.path.exists("/proc/stat"):
        pytest.skip("needs /proc/stat")
    idle_before = threads.busy_cores(0.3)
    spinner = mp.get_context("fork").Process(target=_spin, daemon=True)
    spinner.start()
    try:
        import time

        time.sleep(0.3)
        # whole-machine samples round to cores: other load that comes and goes can hide the spinner in one of them
        expected = min(idle_before + 1, threads.available_cores())
        assert any(threads.busy_cores(0.5) >= expected for _ in range(3))
    finally:
        spinner.kill()
        spinner.join()


def _spin():
    while True:
        pass


def test_the_library_logs_and_a_script_shows_it_once_on_stdout(capsys):
    """configure_threads says what it chose through logging; show_library_messages (what scripts call) prints it."""
    import logging

    from morca_env.cli import show_library_messages
    from morca_env.utils.threads import configure_threads

    loggers = [logging.getLogger(name) for name in ("morca_env", "agents")]
    saved = [(list(logger.handlers), logger.level) for logger in loggers]
    for logger in loggers:  # as in a fresh process: no script handler yet (an earlier test may have run a script)
        logger.handlers = [h for h in logger.handlers if not getattr(h, "_morca_script", False)]
        logger.setLevel(logging.NOTSET)
    try:
        configure_threads(1)
        assert "torch thread(s)" not in capsys.readouterr().out  # the library alone prints nothing
        show_library_messages()
        show_library_messages()  # idempotent: one handler
        configure_threads(1)
        assert capsys.readouterr().out.count("1 torch thread(s) per worker (requested;") == 1
        logging.getLogger("agents.online").info("round 1/2: rollout PSNR 30.00 dB")
        assert capsys.readouterr().out == "round 1/2: rollout PSNR 30.00 dB\n"
    finally:
        for logger, (handlers, level) in zip(loggers, saved):
            logger.handlers = handlers
            logger.setLevel(level)
