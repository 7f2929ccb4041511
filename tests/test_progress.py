"""Progress as people expect it: a tqdm bar on a terminal, plain lines with done/total, rate and ETA elsewhere."""
import io
import re

from cotsdl.progress import Progress, duration
from cotsdl.train.steplog import StepLog


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_duration_is_short():
    assert [duration(s) for s in (0, 42.4, 185, 7620, -3)] == ["0s", "42s", "3m05s", "2h07m", "0s"]


def test_plain_lines_carry_done_total_rate_and_eta():
    out = io.StringIO()
    p = Progress(10, "natural x.h5", "images", out, every=0)
    for done in (3, 6, 10):
        p.update(done)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in out.getvalue()
    assert re.fullmatch(r"natural x\.h5: 3/10 images \(30%\), [0-9.e+]+ images/s, ETA (\d+s|\d+m\d\ds)", lines[0])
    assert lines[-1].startswith("natural x.h5: 10/10 images (100%)") and "done in" in lines[-1]


def test_short_work_says_nothing_and_other_ranks_never_speak():
    out = io.StringIO()
    p = Progress(10, "quick", stream=out, every=60)
    for done in range(1, 11):
        p.update(done)
    q = Progress(10, "rank 1", stream=out, every=0, enabled=False)
    q.update(5)
    assert out.getvalue() == ""


def test_a_terminal_gets_a_bar_that_lines_do_not_break():
    out = Terminal()
    p = Progress(8, "stage 0", "steps", out, start=2)
    p.update(5, loss="1.23")
    p.write("a log line")
    p.close()
    text = out.getvalue()
    assert "stage 0" in text and "5/8" in text and "loss=1.23" in text and "\r" in text
    assert "a log line\n" in text


def test_the_log_line_of_a_step_says_step_of_total_and_eta():
    out = io.StringIO()
    log = StepLog(out, None, True)
    log.begin(0, 2, 6)
    rec = {"stage": 0, "stage_step": 4, "step": 4, "loss": 1.5, "reconstruction": 1.0, "sparsity": 0.5,
           "images_per_s": 100.0, "seconds": 0.01, "exchange_seconds": 0.0, "lr": 0.01}
    log.report(rec)
    log.end()
    line = out.getvalue().strip()
    assert line.startswith("stage 0 step 4/6 (global 4): loss 1.5 ") and re.search(r"; ETA \d+s$", line), line


def test_a_step_log_says_everything_on_its_own_stream():
    """Before, during and after a stage (a resume message comes before any stage begins)."""
    out = io.StringIO()
    log = StepLog(out, None, True)
    log.say("resumed from here")
    log.begin(0, 0, 2)
    log.say("checkpoint")
    log.end()
    log.say("done")
    assert out.getvalue() == "resumed from here\ncheckpoint\ndone\n"
