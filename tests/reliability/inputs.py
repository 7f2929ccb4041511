"""Reliability cases: bad inputs of round two -- configs rejected at load time, HDF5 files that reach
outside themselves or declare more than they hold, and MPMD launches whose ranks disagree.  Collected by
``run.py``."""
import numpy as np

from cotsdl.io.dataset import write_dataset

from .harness import Job, MPIEXEC, PY, _bad_input, account, check, cotsdl_run, expect_error, snapshot


def case_config_pool_eps_zero(ctx):
    """Rejected when the config is read, on every rank, before a run folder exists (it used to fail
    later, on one rank, after the folder was written)."""
    _bad_input(ctx, "network.stages[0].pool.eps = 0.0: must be a number > 0", sets=["network.stages[0].pool.eps=0.0"])
    check(not (ctx.tmp / "run").exists(), "a run folder was made")


def case_config_std_floor_beyond_float32(ctx):
    """A std_floor that rounds to 0 in float32 used to pass and then blame the dataset's statistics
    (NaN images); now it is refused when the config is read, the --set named as typed."""
    _bad_input(ctx, "--set data.std_floor = 1e-300: must be a number >= 1e-30 and <= 1e+30",
               sets=["data.std_floor=1e-300"])
    check(not (ctx.tmp / "run").exists(), "a run folder was made")


def case_config_stride_does_not_tile(ctx):
    """A stride that does not tile its input would drop pixels silently: refused unless allow_crop."""
    _bad_input(ctx, "network.stages[1].filter: its 2x2 windows at stride 2x2 over a 5x5 input leave 1 row(s) and "
               "1 column(s) unread", sets=["network.stages[1].filter.stride=[2, 2]"])


def case_config_not_utf8(ctx):
    ctx.data()
    cfg = ctx.config()
    cfg.write_bytes(cfg.read_bytes().replace(b"[data]", b"# caf\xe9 (latin-1)\n[data]"))
    before = snapshot(ctx.tmp)
    j = cotsdl_run(ctx.tmp, ["train", cfg])
    expect_error(ctx, j, f"config {cfg}: not UTF-8 text", 2)
    account(ctx, before)


def _with_foreign(path, how):
    """A valid dataset that also reaches outside itself (or claims more than it holds)."""
    import h5py

    write_dataset(path, np.random.default_rng(0).integers(0, 256, (40, 12, 12), dtype=np.uint8))
    with h5py.File(path, "a") as f:
        how(f, path)
    return path


def case_data_external_link(ctx):
    """A dataset file must not make every rank read another file (here: a dangling external link)."""
    import h5py

    data = _with_foreign(ctx.tmp / "ext.h5", lambda f, p: f.__setitem__("labels", h5py.ExternalLink("/nonexistent.h5", "/x")))
    _bad_input(ctx, "'/labels' is an external link (to /nonexistent.h5:/x)", data=data)


def case_data_virtual_dataset(ctx):
    import h5py

    def virtual(f, p):
        src = p.with_name("src.h5")
        write_dataset(src, np.zeros((40, 12, 12), np.uint8))
        lay = h5py.VirtualLayout(shape=(40, 12, 12), dtype=np.uint8)
        lay[:] = h5py.VirtualSource(str(src), "images", shape=(40, 12, 12))
        del f["images"]
        f.create_virtual_dataset("images", lay)
    _bad_input(ctx, "'/images' is a virtual dataset", data=_with_foreign(ctx.tmp / "virt.h5", virtual))


def case_data_declares_2_to_the_40_images(ctx):
    def huge(f, p):
        for k in ("images", "image_mean", "image_std"):
            del f[k]
        f.create_dataset("images", shape=(2 ** 40, 12, 12), dtype=np.uint8, chunks=(1, 12, 12))
    _bad_input(ctx, "'/images' declares (1099511627776, 12, 12) in 1099511627776 chunk(s) but the file stores 0",
               data=_with_foreign(ctx.tmp / "huge.h5", huge))
    j = cotsdl_run(ctx.tmp, ["inspect", ctx.tmp / "huge.h5"], ranks=1, name="inspect")
    check(j.rc == 2 and "NOT VALID" in j.out, f"inspect calls the file valid ({j.rc}): {j.out[-400:]}")


def _mpmd(ctx, left, right, name, cwd=(None, None)):
    """mpiexec -n 1 [left] : -n 1 [right]: two ranks started with different arguments (or folders)."""
    cmd = [MPIEXEC]
    for args, wdir in zip((left, right), cwd):
        cmd += (["-n", "1"] + (["-wdir", str(wdir)] if wdir else []) + [PY, "-m", "mpi4py", "-m", "cotsdl"]
                + list(map(str, args)) + [":"])
    j = Job(cmd[:-1], ctx.tmp, name)
    j.wait()
    return j


def case_mpmd_other_command(ctx):
    """train on one rank, info on the other: refused on both at once (it used to hang)."""
    ctx.data()
    cfg = ctx.config()
    before = snapshot(ctx.tmp)
    j = _mpmd(ctx, ["train", cfg], ["info"], "mpmd")
    expect_error(ctx, j, "the ranks were started with different commands (rank 0: cotsdl train", 2)
    check(not (ctx.tmp / "run").exists(), "a run folder was made")
    account(ctx, before)


def case_mpmd_other_config_content(ctx):
    """The same command, but each rank's config file says something else: the differing key is named."""
    ctx.data()
    (ctx.tmp / "a").mkdir()
    (ctx.tmp / "b").mkdir()
    ctx.config(name="a/c.toml")
    text = (ctx.tmp / "a" / "c.toml").read_text()
    (ctx.tmp / "b" / "c.toml").write_text(text.replace("steps = [6, 6]", "steps = [6, 7]"))
    before = snapshot(ctx.tmp)
    j = _mpmd(ctx, ["train", "c.toml"], ["train", "c.toml"], "mpmd", cwd=(ctx.tmp / "a", ctx.tmp / "b"))
    expect_error(ctx, j, "train.steps: [6, 6] -> [6, 7]", 2)
    account(ctx, before)


def case_mpmd_other_data_file(ctx):
    """The same command and config, a relative data path that names another file on each rank."""
    for d, seed in (("a", 0), ("b", 1)):
        (ctx.tmp / d).mkdir()
        write_dataset(ctx.tmp / d / "tiny.h5", np.random.default_rng(seed).integers(0, 256, (40, 12, 12), dtype=np.uint8))
    cfg_text = ctx.config(data="tiny.h5").read_text()
    for d in ("a", "b"):
        (ctx.tmp / d / "c.toml").write_text(cfg_text)
    before = snapshot(ctx.tmp)
    j = _mpmd(ctx, ["train", "c.toml"], ["train", "c.toml"], "mpmd", cwd=(ctx.tmp / "a", ctx.tmp / "b"))
    expect_error(ctx, j, "data.file: the ranks do not read the same file", 2)
    check(not (ctx.tmp / "run").exists(), "a run folder was made")
    account(ctx, before)
