from gymkube_envserver.router.cli import main

main()
