"""The mesh on one machine: start, supervise and stop the service processes (`inferix serve`, the tests).

What it owns:

- `local`: the whole mesh on 127.0.0.1 (`MeshConfig`, `Mesh`, `start_mesh`): kvcache_svc, streamer,
  workers (or worker pods), scheduler, and a local RTMP relay, with `Mesh.relaunch` to start one again.
- `launch`: start one service process, find its ports through its port file, stop it by pid.
- `supervisor`: restart exited children with backoff, stop on a crash loop (`inferix serve` opts in).
- `rtmp_relay`: the local RTMP relay (nginx with the RTMP module) that sessions push to and viewers play.

The services themselves live in their own packages (scheduler, workers, streamer, kvcache_svc); the
`inferix serve` command is inferix_cli/serve.py.
"""

from inferix_cli.mesh.local import Mesh, MeshConfig, start_mesh

__all__ = ["Mesh", "MeshConfig", "start_mesh"]
