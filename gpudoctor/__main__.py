from gpudoctor.entry import main

main()
