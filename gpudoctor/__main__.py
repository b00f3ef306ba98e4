from gpudoctor.cli import main

main()
