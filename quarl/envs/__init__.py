"""Environments as `dm_env.Environment`: the factory and task lists (`factory`), MinAtar (`minatar`) and ALE
(`ale`) on the pixel base (`pixel`), K environments stepped together (`vector`), and envpool's C++ DM Control
tasks (`envpool`)."""
