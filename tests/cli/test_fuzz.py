"""Fuzz through the CLI: mutated real configs give a map (exit 0) or one clean line (exit 2), within the
cost bound. shard_map itself is fuzzed in test_properties; the app in app/test_app_fuzz."""
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.cost import measure
from tests.config.test_properties import mutated_configs
from tpviz.cli.main import main as cli_main


@settings(max_examples=60, deadline=None,  # capsys is drained before each call, so sharing it is safe
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cfg=mutated_configs(), tp=st.sampled_from(["1", "2", "3", "8", "64", "0", "-1", "x"]),
       command=st.sampled_from(["map", "valid"]))
def test_cli_maps_or_exits_2_with_one_line(cfg, tp, command, capsys):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(cfg))
        argv = [command, str(path)] + (["--tp", tp, "--json", str(Path(d) / "out.json")]
                                       if command == "map" else [])
        capsys.readouterr()
        took, _, rc = measure(lambda: cli_main(argv))
        err = capsys.readouterr().err
        assert took < 4
        assert rc in (0, 2), (rc, err)
        if rc == 2:
            assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
        elif command == "map":
            assert json.loads((Path(d) / "out.json").read_text())["tp_size"] == int(tp)
