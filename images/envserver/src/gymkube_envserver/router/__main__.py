from gymkube_envserver.router.app import main

main()
