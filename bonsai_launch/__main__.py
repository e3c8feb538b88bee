from bonsai_launch.cli.main import run

run()
