"""Programs and their runners: the generic node graph (`graph`: Node, Program, handles, the Runner and
Launch interfaces), the local (threads), Ray and loopback-cluster runners, and which node may see
an accelerator (`devices`). Knows nothing of ActorQ."""
