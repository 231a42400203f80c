from diffeval.cli import main

main()
