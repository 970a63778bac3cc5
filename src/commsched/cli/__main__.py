from commsched.cli import main

main()
