set terminal pngcairo size 900,560 noenhanced
set output 'e11l-workers-256-consensus.png'
set title 'E11, part 2: 256 and 1,024 nano workers on 50 ms links, GASLoC against DiLoCo with a tree all-reduce [workers=256]'
set xlabel 'training step (inner steps)'
set ylabel 'consensus distance (mean squared distance to the average)'
set logscale y
set grid
set key top right
plot 'e11l-workers-256-consensus.dat' index 0 with linespoints title 'diloco', 'e11l-workers-256-consensus.dat' index 1 with linespoints title 'gasloc-1peer', 'e11l-workers-256-consensus.dat' index 2 with linespoints title 'gasloc-2peer'
