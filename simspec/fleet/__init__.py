"""Fleets: replicas of one setup behind a router (simspec.fleet.routers),
served as one run (simspec.fleet.run) whose log merges theirs
(simspec.fleet.merge)."""
