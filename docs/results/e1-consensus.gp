set terminal pngcairo size 900,560 noenhanced
set output 'e1-consensus.png'
set title 'E1: one local step (H = 1), GASLoC against DAdam in both orders'
set xlabel 'training step (inner steps)'
set ylabel 'consensus distance (mean squared distance to the average)'
set logscale y
set grid
set key top right
plot 'e1-consensus.dat' index 0 with linespoints title 'gasloc-1peer', 'e1-consensus.dat' index 1 with linespoints title 'gasloc-2peer', 'e1-consensus.dat' index 2 with linespoints title 'dadam-cta-1peer', 'e1-consensus.dat' index 3 with linespoints title 'dadam-cta-ring', 'e1-consensus.dat' index 4 with linespoints title 'dadam-cta-complete', 'e1-consensus.dat' index 5 with linespoints title 'dadam-atc-1peer', 'e1-consensus.dat' index 6 with linespoints title 'allreduce-adamw'
