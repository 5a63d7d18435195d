set terminal pngcairo size 900,560 noenhanced
set output 'e4-H-10_outer_momentum-0.6-step.png'
set title 'E4: sensitivity to H, outer learning rate and momentum [H=10,outer_momentum=0.6]'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e4-H-10_outer_momentum-0.6-step.dat' index 0 with linespoints title 'diloco', 'e4-H-10_outer_momentum-0.6-step.dat' index 1 with linespoints title 'gasloc-2peer', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
