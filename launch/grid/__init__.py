"""The reproduction grid (`launch.reproduce`): one run's budget and how it is run (`runs`), and the
grid's runs as Ray tasks on a cluster (`cluster`)."""
