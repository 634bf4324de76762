from wirecut.cli import main

main()
