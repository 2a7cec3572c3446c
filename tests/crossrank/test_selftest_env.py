from distdoctor.world.selftest import rank_environment


def test_self_test_ranks_get_torchruns_thread_default(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = rank_environment(1, 2, 29500, "run")
    assert env["OMP_NUM_THREADS"] == "1"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("1", "1", "2")


def test_a_users_thread_setting_is_left_alone(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert "OMP_NUM_THREADS" not in rank_environment(0, 2, 29500, "run")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "OMP_NUM_THREADS" not in rank_environment(0, 1, 29500, "run")  # one rank: torchrun leaves it too
